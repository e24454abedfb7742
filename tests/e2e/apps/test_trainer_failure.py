"""A GRPO run whose trainer process is SIGKILLed mid-run: it stops at once with an error naming
the process and the last checkpoint, exits 1 with no process left, and ``forge run --resume``
finishes it; with ``restart_on_failure`` it restarts from the checkpoint by itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import (
    REPO,
    actor_processes,
    forge_run,
    script_env,
    tiny_grpo_config,
    wait_dead,
)

STEPS = 60


def _config(tmp_path: Path) -> Path:
    return tiny_grpo_config(tmp_path, STEPS, "checkpoint_every: 3")


def _start(config: Path, run: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", "--config", str(config), "--run-dir", str(run)]
        + list(overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        cwd=REPO,
    )


def _kill_trainer_after_checkpoint(proc: subprocess.Popen, run: Path) -> tuple[int, list[int]]:
    """SIGKILL this run's trainer process (found by its FORGE_MESH among the run's own
    descendants) once a checkpoint exists; returns its pid and every pid of the run."""
    latest = run / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    trainers = list(actor_processes(proc.pid, "Trainer"))
    trainer = trainers[0] if len(trainers) == 1 else None
    assert trainer is not None, f"not one Trainer worker among {pids}: {trainers}"
    assert proc.poll() is None, "the run ended before its trainer could be killed"
    os.kill(trainer, signal.SIGKILL)
    return trainer, pids


def _trained_steps(run: Path) -> list[int]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train/loss" in r]


@pytest.mark.timeout(600)
def test_killed_trainer_stops_the_run_and_resume_finishes_it(tmp_path):
    config, run = _config(tmp_path), tmp_path / "run"
    proc = _start(config, run)
    trainer, pids = _kill_trainer_after_checkpoint(proc, run)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    stopped_s = time.monotonic() - t0
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert stopped_s < 30, stopped_s  # a step's wait plus stopping the other processes
    assert not wait_dead(pids, 10), "processes of the run outlived it"
    # One error naming the process, the signal and the last checkpoint; then the command.
    m = re.search(r"last checkpoint: step (\d+) \((.+?)\)", err)
    assert m, err[-3000:]
    step = int(m.group(1))
    assert step >= 3 and step % 3 == 0
    assert "TrainerDiedError: the run's trainer died: process for mesh 'Trainer" in err
    assert f"(pid {trainer}) died: signal 9 (SIGKILL)" in err
    assert f"forge run --resume {run}" in err
    assert "Traceback" not in err  # a named error, not a stack dump

    out = forge_run(["--resume", str(run)], timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints' / f'step_{step:06d}'} (step {step})" in out.stdout
    assert _trained_steps(run)[-1] == STEPS
    assert f"[grpo] done: version {STEPS}" in out.stdout


@pytest.mark.timeout(600)
def test_restart_on_failure_restarts_from_the_checkpoint_by_itself(tmp_path):
    config, run = _config(tmp_path), tmp_path / "run"
    proc = _start(config, run, "restart_on_failure=1")
    trainer, pids = _kill_trainer_after_checkpoint(proc, run)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    m = re.search(
        r"\[forge\] the trainer died \(process for mesh 'Trainer-\d+' rank 0 \(pid (\d+)\) died: "
        # a death noticed on connecting adds its detail: "...(SIGKILL); cannot connect to ..."
        r"signal 9 \(SIGKILL\)(?:; [^\n]*?)?\); restarting the run from checkpoint step (\d+) "
        r"\(restart 1 of 1\)",
        out,
    )
    said = [ln for ln in out.splitlines() if "died" in ln or "restart" in ln or "resumed" in ln]
    assert m and int(m.group(1)) == trainer, (trainer, said, out[-1500:], err[-1500:])
    step = int(m.group(2))
    assert f"resumed from {run / 'checkpoints' / f'step_{step:06d}'} (step {step})" in out
    steps = _trained_steps(run)
    assert steps[-1] == STEPS and set(range(1, STEPS + 1)) <= set(steps)
    assert not wait_dead(pids, 10)


def test_restarts_need_checkpoints(tmp_path):
    """Checked when the config loads, before anything spawns."""
    out = forge_run(
        [
            "--config",
            str(_config(tmp_path)),
            "--run-dir",
            str(tmp_path / "r"),
            "restart_on_failure=2",
            "checkpoint_every=0",
        ],
        timeout=120,
    )
    assert out.returncode == 2
    assert "restart_on_failure=2" in out.stderr and "checkpoint_every > 0" in out.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
