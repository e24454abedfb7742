"""``forge run`` keeps ``status.json`` current and marks how the run ended; ``forge top``
shows it: a finished run, a crashed one (with its error), and a controller killed outright
(not updating, its pid gone). Real processes throughout."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers import REPO, script_env, wait_dead

APP = "tests.e2e.apps.status_app"


def _cfg(tmp_path, end: str) -> str:
    path = tmp_path / f"{end}.yaml"
    path.write_text(yaml.safe_dump({"app": APP, "end": end}))
    return str(path)


def _forge(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", *args],
        capture_output=True,
        text=True,
        env=script_env(COLUMNS="160"),
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.timeout(240)
def test_finished_and_crashed_runs_say_so(tmp_path):
    for end, code, state in (("finish", 0, "finished"), ("crash", 1, "crashed")):
        run = tmp_path / end
        out = _forge("run", "--config", _cfg(tmp_path, end), "--run-dir", str(run))
        assert out.returncode == code, out.stdout + out.stderr
        victim = int(re.search(r"KILLED (\d+)", out.stdout).group(1))
        snap = json.loads((run / "status.json").read_text())
        assert snap["state"] == state and snap["info"]["app"] == APP
        (echo,) = snap["services"]
        r0, r1 = echo["replicas"]
        assert (r0["restarts"], r0["state"], r1["restarts"]) == (1, "healthy", 0)
        assert victim not in r0["pids"] and str(victim) in r0["last_error"]
        assert snap["extra"]["rl"]["step"] == 7
        top = _forge("top", str(run), "--once")
        assert top.returncode == 0, top.stderr
        assert state.upper() in top.stdout and "step 7/10" in top.stdout
        assert "Echo" in top.stdout and "SIGKILL" in top.stdout
        if end == "crash":
            assert snap["error"] == "RuntimeError: the reward went NaN"
            assert "the reward went NaN" in top.stdout and "status_app.py" in top.stdout
        else:
            assert snap["error"] is None and "CRASHED" not in top.stdout


def _start_hanging(tmp_path, run) -> subprocess.Popen:
    """``forge run`` of the app that hangs after its replica restarted; returns once there."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            _cfg(tmp_path, "hang"),
            "--run-dir",
            str(run),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=script_env(),
        cwd=REPO,
    )
    line, deadline = "", time.monotonic() + 120
    while not line.startswith("KILLED"):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"the app did not start: {line!r}")
        line = proc.stdout.readline()
    return proc


@pytest.mark.timeout(240)
def test_ctrl_c_marks_the_run_interrupted(tmp_path):
    run = tmp_path / "int"
    proc = _start_hanging(tmp_path, run)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    snap = json.loads((run / "status.json").read_text())
    assert snap["state"] == "interrupted" and len(snap["services"]) == 1
    assert "INTERRUPTED" in _forge("top", str(run), "--once").stdout


@pytest.mark.timeout(240)
def test_a_killed_controller_shows_as_not_updating(tmp_path):
    run = tmp_path / "hang"
    proc = _start_hanging(tmp_path, run)
    try:
        snap = json.loads((run / "status.json").read_text())
        pids = [p for s in snap["services"] for r in s["replicas"] for p in r["pids"]]
        assert snap["state"] == "running" and len(pids) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert wait_dead(pids, 10) == []  # actor processes follow their controller
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    assert json.loads((run / "status.json").read_text())["state"] == "running"
    time.sleep(5.5)  # past the staleness threshold (max(3 intervals, 5 s))
    top = _forge("top", str(run), "--once")
    # the header wraps where the run's path is long (under xdist: .../popen-gw1/...): read
    # the panel's text as one line
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", top.stdout).split())
    assert "NOT UPDATING" in text and f"process {proc.pid} is gone" in text, top.stdout
