"""Issue 35: GRPO with ``placement.colocate`` on CPU. The generator sleeps while the trainer
steps and every phase's memory is logged each step; a trainer step that fails while the
generator sleeps stops the run with that error, and ``--resume`` finishes it in the same
mode, with the memory after each cycle at the first cycle's level."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, forge_run, run_metrics, script_env, tiny_grpo_config

PHASES = ("generate", "asleep", "train", "awake")
STEPS = 6


def _steps(run) -> list[dict]:
    return [r for r in run_metrics(run) if "train/loss" in r]


def _check_rows(rows: list[dict]) -> None:
    for row in rows:  # every step, every phase, both roles: host RSS at least
        for role in ("generator", "trainer"):
            for phase in PHASES:
                assert row[f"memory/{role}/{phase}/rss_mb"] > 0, (role, phase, row["step"])
        assert row["time/colocate_sleep_s"] >= 0 and row["time/colocate_wake_s"] >= 0
        assert row["colocate/optimizer_offloaded_bytes"] == 0  # CPU: nothing moves


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_colocated_run_fails_while_asleep_and_resumes(tmp_path):
    marker = tmp_path / "fail-now"
    loss = f"{{type: 'tests.e2e.apps.flaky_loss:fail_when_marked', kwargs: {{marker: '{marker}'}}}}"
    extra = (
        f"max_policy_age: 0\nplacement: {{colocate: true}}\ncheckpoint_every: 2\n"
        f"trainer: {{optimizer: {{lr: 1.0e-4}}, loss: {loss}}}"
    )
    config = (
        tiny_grpo_config(tmp_path, STEPS, "")
        .read_text()
        .replace("trainer: {optimizer: {lr: 1.0e-4}}", extra)
    )
    path = tmp_path / "colocate.yaml"
    path.write_text(config)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", "--config", str(path), "--run-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 200
        while len(_steps(run)) < 2:  # a checkpoint exists: fail the next trainer step
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "not 2 steps within 200 s"
            time.sleep(0.05)
        marker.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert "injected trainer failure" in out + err
    assert not marker.exists()  # the failing step ran (with the generator asleep)
    failed_at = len(_steps(run))
    assert 2 <= failed_at < STEPS
    _check_rows(_steps(run))

    more = forge_run(["--resume", str(run)], timeout=200)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    rows = _steps(run)
    assert rows[-1]["step"] == STEPS
    _check_rows(rows)
    # The processes' memory after each cycle stays near the first cycle's level (the unit
    # test tests/unit/test_generator_sleep.py bounds it tightly on a bigger model).
    awake = [r["memory/generator/awake/rss_mb"] for r in rows[failed_at:]]
    assert max(awake) - awake[0] < 64, awake
