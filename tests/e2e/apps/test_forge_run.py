"""``forge run``: typed config, overrides, run directory, errors, resume, Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import yaml

from tests.helpers import REPO, script_env, wait_dead

APP = "tests.e2e.apps.sample_app"


def _forge(args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", *args],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=120,
        **kw,
    )


def _write(tmp_path, data) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_run_writes_resolved_config_and_outputs(tmp_path):
    cfg = _write(tmp_path, {"app": APP, "inner": {"steps": 2}})
    out = _forge(["run", "--config", cfg, "--run-dir", str(tmp_path / "run"), "greeting=hi"])
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "out.txt").read_text().startswith("hi 2 False")
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["greeting"] == "hi" and saved["inner"]["steps"] == 2
    # resume reloads the saved config (plus overrides) and tells the app
    out = _forge(["run", "--resume", str(tmp_path / "run"), "inner.steps=5"])
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "out.txt").read_text().startswith("hi 5 True")


def test_config_errors_name_the_key_before_spawning(tmp_path):
    cfg = _write(tmp_path, {"app": APP, "inner": {"stepz": 2}})
    out = _forge(["run", "--config", cfg, "--run-dir", str(tmp_path / "run")])
    assert out.returncode == 2
    assert "inner.stepz" in out.stderr and "steps" in out.stderr and "cfg.yaml" in out.stderr
    assert not (tmp_path / "run" / "out.txt").exists()
    out = _forge(["run", "--config", _write(tmp_path, {"greeting": "x"})])
    assert out.returncode == 2 and "'app'" in out.stderr


def test_ctrl_c_stops_everything(tmp_path):
    cfg = _write(tmp_path, {"app": APP, "inner": {"sleep_s": 60}})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            cfg,
            "--run-dir",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        cwd=REPO,
    )
    deadline = time.monotonic() + 60
    pid = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ACTOR_PID"):
            pid = int(line.split()[1])
            break
    assert pid is not None, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    assert wait_dead([pid], 5) == []
