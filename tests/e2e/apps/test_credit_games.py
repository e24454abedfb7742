"""Credit over turns end to end on the subtraction game (real processes, a few steps): the
step-level groups form, per-turn advantages reach the trainer, and PPO over turns trains its
critic. Learning itself is measured by ``benchmarks/credit/run.py`` (docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, forge_run, script_env

# The SFT stage teaches the game's move format; only the bootstrapped case needs games that
# last (with 1 SFT step its games ended before max_turns), the others check what every game's
# first turn shows, so they take one SFT step.
SHORT = [
    "rl.steps=4",
    "rl.eval.every=0",
    "rl.eval.at_start=false",
    "rl.rollout.prompts_per_step=4",
]


def _steps(run) -> list[dict]:
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


@pytest.mark.parametrize(
    ("method", "overrides"),
    [
        ("gigpo", ["sft.steps=1", "rl.rollout.credit=gigpo"]),
        # Three turns cut most games short: their returns bootstrap from the critic.
        (
            "ppo_turns",
            [
                "sft.steps=20",
                "rl.critic.level=turn",
                "rl.trainer.loss.type=ppo",
                "rl.critic.bootstrap_truncated=true",
                "rl.env.max_turns=3",
            ],
        ),
        # A history window: each turn its own row, the critic's GAE across an episode's rows.
        (
            "ppo_turns_window",
            [
                "sft.steps=1",
                "rl.critic.level=turn",
                "rl.trainer.loss.type=ppo",
                "rl.env.history.turns=0",
                "rl.env.history.keep_task=false",
            ],
        ),
    ],
)
def test_credit_methods_run(tmp_path, method, overrides):
    run = tmp_path / "run"
    out = forge_run(
        [
            "--config",
            str(REPO / "benchmarks/credit/subtraction.yaml"),
            "--run-dir",
            str(run),
            *SHORT,
            *overrides,
        ],
        timeout=280,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "success_rate=" in out.stdout
    steps = _steps(run)
    assert len(steps) == 4
    if method == "gigpo":
        # Every group starts from one pile, so at least the first turns share a state.
        # (Rollout metrics are logged with the step they reach, so a row may have none.)
        rolled = [r for r in steps if "credit/step_grouped_turns" in r]
        assert len(rolled) >= 2 and all(r["credit/step_grouped_turns"] > 0 for r in rolled)
        assert all("credit/advantage_std/turn0" in r for r in rolled)
    elif method == "ppo_turns":
        assert all(r["train/critic/tokens"] > 0 for r in steps)
        assert sum(r.get("env/finish/max_turns", 0) for r in steps) > 0  # bootstrapped
        assert "credit/step_grouped_turns" not in steps[-1]
    else:
        assert all(r["train/critic/tokens"] > 0 for r in steps)
        cfg = (run / "config.yaml").read_text()
        assert "history:\n    turns: 0\n    keep_task: false" in cfg  # the SFT stage's too
