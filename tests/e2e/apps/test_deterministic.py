"""``deterministic: true``: the CPU demo's first steps (SFT, then GRPO) run twice from the
same config and seed give the same metrics, exactly (times and busy fractions aside)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import REPO, forge_run

STEPS = [
    "deterministic=true",
    "sft.steps=20",
    "rl.steps=3",
    "rl.rollout.prompts_per_step=4",
    "rl.eval.at_start=false",
    "rl.eval.at_end=false",
    "rl.eval.every=0",
]
# Wall-clock measurements, and the buffer's size at the moment its metrics are flushed (the
# rollout loop is already filling the next step by then, as far as it got).
VARYING = ("time/", "seconds", "tokens_per_s", "busy_fraction", "replay/size")


def _metrics(run: Path) -> list[dict]:
    rows = []
    for stage in ("sft", "rl"):
        for line in (run / stage / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows.append(
                {k: v for k, v in row.items() if k != "time" and not any(p in k for p in VARYING)}
            )
    return rows


def test_two_deterministic_runs_give_the_same_numbers(tmp_path):
    runs = []
    for name in ("a", "b"):
        out = forge_run(
            [
                "--config",
                str(REPO / "apps/sumdigits/cpu.yaml"),
                "--run-dir",
                str(tmp_path / name),
                f"base_model={tmp_path / 'base'}",
                *STEPS,
            ],
            timeout=400,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert "[forge] deterministic: threads_per_actor: 0 -> 1" in out.stdout
        runs.append(_metrics(tmp_path / name))
    a, b = runs
    assert len([r for r in a if "train/loss" in r]) == 3 and len(a) == len(b)
    for row_a, row_b in zip(a, b):
        assert row_a == row_b  # exactly: same floats, not approximately
