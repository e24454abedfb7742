"""The multi-turn demo end to end: SFT on random in-range guesses, then GRPO in the game."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import REPO, forge_run, script_env


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the whole demo: ~4 minutes on 2 cores (the default is 300 s)
def test_guess_demo_learns(tmp_path):
    run = tmp_path / "run"
    out = forge_run(
        ["--config", str(REPO / "apps/guess/cpu.yaml"), "--run-dir", str(run), "rl.eval.every=0"],
        timeout=1200,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("success_rate=")][-1]
    s = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
    assert s["optimal"] == 1.0
    # Measured spread (benchmarks/learning_spread.py, this command at seeds 0-2, 2026-11-24;
    # 8 held-out games, greedy): baseline (SFT) 0.875 at every seed, after GRPO 0.875, 1.0,
    # 1.0. The held-out set is too small to show more than one game's gain, so the test
    # asks for no loss against the SFT start and the 0.875 every seed reached.
    assert s["success_rate"] >= max(s["baseline"], 0.875), s
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 120
    assert {"env/turns", "rollout/reward/success", "env/sampled_tokens"} <= set(steps[-1])
    assert max(r["train/logprob_gap"] for r in steps[:1]) < 1e-4  # generator == trainer
