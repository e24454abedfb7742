"""Issue 35: a GRPO run with ``placement.colocate`` on CPU: the generator sleeps while the
trainer steps, every phase's memory is logged each step and does not grow, and a run
stopped after a checkpoint resumes in the same mode."""

from __future__ import annotations

import pytest

from tests.helpers import forge_run, run_metrics, tiny_grpo_config

PHASES = ("generate", "asleep", "train", "awake")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_colocated_run_logs_memory_per_phase_and_resumes(tmp_path):
    config = tiny_grpo_config(
        tmp_path, 4, "max_policy_age: 0\nplacement: {colocate: true}\ncheckpoint_every: 2"
    )
    run = tmp_path / "run"
    out = forge_run(["--config", str(config), "--run-dir", str(run)], timeout=200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = [r for r in run_metrics(run) if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for row in steps:  # every step, every phase, both roles: host RSS at least
        for role in ("generator", "trainer"):
            for phase in PHASES:
                assert row[f"memory/{role}/{phase}/rss_mb"] > 0, (role, phase, row["step"])
        assert row["time/colocate_sleep_s"] >= 0 and row["time/colocate_wake_s"] >= 0
        assert row["colocate/optimizer_offloaded_bytes"] == 0  # CPU: nothing moves
    # The processes' memory after each cycle stays at the first cycle's level (the unit test
    # tests/unit/test_generator_sleep.py bounds it tightly on a bigger model).
    awake = [r["memory/generator/awake/rss_mb"] for r in steps]
    assert max(awake) - awake[0] < 64, awake
    # A later run resumes from the checkpoint at step 4 and goes on in the same mode.
    more = forge_run(["--resume", str(run), "steps=6"], timeout=200)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    steps = [r for r in run_metrics(run) if "train/loss" in r]
    assert [r["step"] for r in steps][-2:] == [5, 6]
    assert "memory/generator/asleep/rss_mb" in steps[-1]
