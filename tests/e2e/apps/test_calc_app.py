"""The calculator demo end to end with real processes: GRPO with the tool beats its SFT start
and the model answering without the tool."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env

CONFIG = str(REPO / "apps/calc/cpu.yaml")
# Measured on the 64 held-out questions when this test was written: 0.375 after SFT; after
# GRPO 0.594 (the demo's 100 steps) and 0.641 in a 60-step run. On 2026-11-23 the SFT result
# varied from run to run between 0.41 and 0.95 (0.953 at ff27f0d; 0.938, 0.859 and 0.406 at
# later commits; SFT is not bit-reproducible across thread counts), and GRPO then ended at
# 0.80-0.98 (0.406 -> 0.797, 0.859 -> 0.984). From a start of 0.9 a +MARGIN gain in greedy
# held-out accuracy is impossible, so that check becomes "reach CEILING" there. Learning is
# checked in every run by the sampled (temperature 1) training reward, which starts low even
# from a strong SFT: the mean of the first 10 steps against the last 10 went 0.221 -> 0.727
# and 0.625 -> 0.969 in those two runs. Runs are not bit-reproducible (asynchronous
# rollouts), and the curve is noisy.
# 60 steps are not enough (tried 2026-11-27): seeds 0/1/2 passed quiet, but a run on a busy
# CI machine went 0.484 -> 0.547 held out (training reward 0.213 -> 0.531). CI then failed once
# from a start of 0.812 (0.859 after GRPO). So both SFT stages are now deterministic
# (apps/calc/cpu.yaml): the start was 0.484 in 4 of 4 runs on the project's machine
# (2026-11-27), and GRPO ended at 0.812 and 0.938 (training reward 0.259 -> 0.756 and
# 0.268 -> 0.792), quiet and with two busy processes beside it. A machine whose float kernels
# differ may start elsewhere; the CEILING rule covers a strong start.
MARGIN = 0.15
CEILING = 0.9


@pytest.mark.timeout(1800)  # the whole demo: ~10 minutes on 2 cores (the default is 300 s)
def test_calc_demo_learns_to_use_the_tool(tmp_path):
    """The demo (without intermediate evals) must clearly beat its SFT start (or, from a strong
    start, reach CEILING), raise its own training reward, and beat the model that answers
    without the tool."""
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            CONFIG,
            "--run-dir",
            str(run),
            "rl.eval.every=0",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("success_rate="), last
    s = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", last)}
    assert s["success_rate"] >= min(s["baseline"] + MARGIN, CEILING), s
    # ... and never ends below a strong start by more than two of the 64 questions.
    assert s["success_rate"] >= s["baseline"] - 2 / 64, s
    assert s["no_tool"] <= 0.05 and s["success_rate"] >= s["no_tool"] + 0.4, s
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 100 and steps[-1]["env/tool_calls"] > 0
    reward = [r["rollout/reward"] for r in steps if "rollout/reward" in r]
    assert len(reward) >= 50, len(reward)  # most steps carry their rollouts' rewards
    first, final = statistics.mean(reward[:10]), statistics.mean(reward[-10:])
    assert final >= min(first + MARGIN, CEILING), (first, final)  # GRPO itself learned
