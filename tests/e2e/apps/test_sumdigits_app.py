"""The CPU demo end to end with real processes: a killed run resumes. (That the demo learns
is checked under replica kills, in ``test_chaos.py``.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO, script_env

CONFIG = str(REPO / "apps/sumdigits/cpu.yaml")


def _forge(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def test_killed_run_resumes_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    args = [
        "--config",
        CONFIG,
        "--run-dir",
        str(run),
        # The claim is the RL stage's checkpoint and resume: one SFT step keeps the pipeline's
        # shape (SFT, then GRPO from its result) without training a model nothing here scores.
        "sft.steps=1",
        "rl.steps=8",
        "rl.checkpoint_every=3",
        "rl.eval.at_start=false",
        "rl.eval.every=0",
    ]
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    latest = run / "rl" / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.exists() and json.loads(latest.read_text())["step"] >= 6:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    saved = json.loads(latest.read_text())["step"]
    assert saved in (6,)

    out = _forge(["--resume", str(run)], tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"resumed from {run / 'rl' / 'checkpoints' / 'step_000006'} (step 6)" in out.stdout
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    resumed_steps = [r["step"] for r in rows if "train/loss" in r][-2:]
    assert resumed_steps == [7, 8]


def test_config_mistakes_fail_before_spawning(tmp_path):
    out = _forge(
        ["--config", CONFIG, "--run-dir", str(tmp_path / "r"), "rl.rollout.group_sise=4"],
        tmp_path,
        timeout=120,
    )
    assert out.returncode == 2
    assert "rl.rollout.group_sise" in out.stderr and "group_size" in out.stderr
    out = _forge(
        ["--config", CONFIG, "--run-dir", str(tmp_path / "r"), "rl.steps=many"],
        tmp_path,
        timeout=120,
    )
    assert out.returncode == 2 and "rl.steps" in out.stderr
    # A misspelt reward name fails at load too, before the SFT stage spawns anything.
    t0 = time.monotonic()
    out = _forge(
        ["--config", CONFIG, "--run-dir", str(tmp_path / "r"), "rl.rewards=[nope]"],
        tmp_path,
        timeout=120,
    )
    assert out.returncode == 2 and time.monotonic() - t0 < 60
    assert "rl.rewards" in out.stderr or "rewards[0]" in out.stderr
    assert "'nope' is not a built-in reward function" in out.stderr and "exact_match" in out.stderr
    assert not (tmp_path / "r" / "sft").exists()
