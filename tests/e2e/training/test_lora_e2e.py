"""The CPU demo with LoRA in both stages, end to end in real processes: adapter-only pushes,
the KL reference from the trainer's own base model (no reference service), adapter
checkpoints, and ``forge export --merge`` of the final adapter into a plain HF model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, script_env

pytest.importorskip("peft")


def _forge(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def test_cpu_demo_with_lora_pushes_adapters_and_exports_a_merged_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    out = _forge(
        [
            "run",
            "--config",
            str(REPO / "apps/sumdigits/cpu.yaml"),
            "--run-dir",
            str(run),
            "sft.steps=20",
            "rl.steps=4",
            "rl.eval.at_start=false",
            "rl.eval.every=0",
            "sft.trainer.lora.rank=8",
            "rl.trainer.lora.rank=8",
            "rl.checkpoint_every=2",
            "rl.trainer.loss.kl_coef=0.01",
            "rl.reference.update.type=none",
        ],
        tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = json.loads((run / "status.json").read_text())
    services = {s["actor"] for s in status["services"]}
    assert "Generator" in services and "ReferenceModel" not in services  # trainer: reference
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 4
    assert steps[0]["train/kl_ref"] == 0.0 and steps[-1]["train/kl_ref"] > 0  # from the base

    # Both stages save adapters; RL's names SFT's as its base, which names the built model.
    for stage in ("sft", "rl"):
        assert (run / stage / "model" / "adapter_config.json").is_file()
        assert not (run / stage / "model" / "config.json").exists()
    rl_base = json.loads((run / "rl" / "model" / "adapter_config.json").read_text())
    assert Path(rl_base["base_model_name_or_path"]) == (run / "sft" / "model").resolve()
    ckpt = run / "rl" / "checkpoints" / "step_000004" / "trainer"
    assert (ckpt / "adapter.safetensors").is_file() and not (ckpt / "model.safetensors").exists()

    assert (
        _forge(["export", str(run), "--merge", str(tmp_path / "merged")], tmp_path, 120).returncode
        == 0
    )
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    for r in steps:  # every push carried only the adapter
        assert r["weights/push_bytes"] < 0.15 * full, (r["weights/push_bytes"], full)
    assert torch.isfinite(model(torch.tensor([[5, 6, 7]])).logits).all()
