"""The multi-turn demo end to end: SFT on random in-range guesses, then GRPO in the game."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from tests.helpers import REPO, forge_run, script_env


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
    # Measured (this command, 2026-11-24): greedy success on the 8 held-out games went
    # 0.875 -> 0.875, 1.0 or 0.875 at seeds 0-2, and to 0.75 in one CI run: one game is the
    # whole gain there, and runs are not bit-reproducible (asynchronous rollouts). So the
    # greedy check allows one lost game, and learning is checked by the sampled success of
    # the training episodes (64 a step), the first 30 steps against the last 60.
    # The windows were the first and last 20 steps until 2026-11-27: gains 0.076-0.111 at
    # seeds 0-2 and +0.036 at load 4-5 (2026-11-24/26). Once the generator took a full batch
    # of requests (it was held to 10 in flight), one run beside the calculator test gained
    # only +0.012 that way, its last 10 steps in a dip (0.742) after 0.82-0.83. Over the
    # wider windows, 8 runs on 2026-11-27 (seeds 0-1 before and after that change, two with
    # a cosine schedule, two in the slow tier) gained +0.023 (that loaded run) to +0.079,
    # median +0.051. A run that learns nothing gains 0 +- ~0.013 (1,900 and 3,800 samples),
    # so the bound stays +0.02. On 2026-11-28 that check failed in 4 of 11 runs (-0.009 to
    # +0.082; one run did not learn at all), so the demo now credits each guess by the
    # interval it was made in (`rollout.credit: gigpo`): 10 runs, 3 of them with two busy
    # processes beside them or a deterministic SFT, gained +0.025 to +0.076, median +0.047.
    assert s["success_rate"] >= s["baseline"] - 1 / 8, s
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 120
    sampled = [r["rollout/reward/success"] for r in steps if "rollout/reward/success" in r]

    def success(part: list[dict]) -> float:
        return statistics.mean(
            r["rollout/reward/success"] for r in part if "rollout/reward/success" in r
        )

    first, last = success(steps[:30]), success(steps[60:])
    assert last >= first + 0.02, (first, last)
    # Rollout metrics land in the row of the step that logged after them; the last row can
    # miss them when no episode finished since the step before (seen once in CI). An
    # episode's env metrics come as it ends; a group's rewards once all 8 of its episodes
    # have, so some rows have none: 103 of 120 rows had them at a cap of 10 requests in flight
    # per generator replica, 94 once the generator took a full batch (2026-11-27), whose
    # groups finish in bursts.
    for key in ("env/turns", "env/sampled_tokens"):
        assert sum(key in r for r in steps) >= 100, key
    assert len(sampled) >= 60, len(sampled)
    assert max(r["train/logprob_gap"] for r in steps[:1]) < 1e-4  # generator == trainer
