"""The REINFORCE example app (``apps/reinforce``): a second algorithm written as one short
file on Forge's pieces runs end to end in real processes through ``forge run``."""

from __future__ import annotations

import json
import math

from forge.models import make_tiny_model
from tests.helpers import REPO, forge_run


def test_reinforce_app_trains_and_evaluates(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    out = forge_run(
        [
            "--config",
            str(REPO / "apps/reinforce/cpu.yaml"),
            "--run-dir",
            str(tmp_path / "r"),
            f"policy.model={model}",
            "steps=3",
            "rollout.prompts_per_step=4",
        ],
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "[reinforce] done: version 3" in out.stdout
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["train/loss"]) and r["time/step_s"] > 0 for r in steps)
    assert all("rollout/reward" in r for r in steps)  # the shared scorer logged the rewards
    evals = [r for r in rows if "eval/heldout_accuracy" in r]
    assert [r["step"] for r in evals] == [0, 3]


def test_reinforce_config_mistakes_fail_before_spawning(tmp_path):
    out = forge_run(
        [
            "--config",
            str(REPO / "apps/reinforce/cpu.yaml"),
            "--run-dir",
            str(tmp_path / "r"),
            "rollout.group_size=4",
        ],
        timeout=120,
    )
    assert out.returncode == 2
    assert "rollout.group_size=1" in out.stderr
