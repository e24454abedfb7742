"""The apps end to end with real processes: the CPU demo learns, and a killed run resumes."""

from __future__ import annotations

import json
import re
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


def _summary(stdout: str) -> dict[str, float]:
    line = [ln for ln in stdout.splitlines() if ln.startswith("heldout_accuracy=")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}


def test_cpu_demo_learns(tmp_path):
    """A shortened demo (fewer SFT and GRPO steps than cpu.yaml) must still visibly learn."""
    run = tmp_path / "run"
    out = _forge(
        ["--config", CONFIG, "--run-dir", str(run), "rl.steps=150", "rl.eval.every=0"],
        tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = _summary(out.stdout)
    # Measured spread (benchmarks/learning_spread.py, this command at seeds 0-7, 2026-11-24):
    # after SFT 0.21-0.815, after GRPO 0.89-0.965, gain 0.15-0.68 (median 0.445); seed 0
    # (this test) 0.21 -> 0.89. Thresholds sit under the worst seed: gain 0.10, final 0.85.
    assert s["heldout_accuracy"] >= s["sft_accuracy"] + 0.10, s
    assert s["heldout_accuracy"] >= 0.85, s
    assert (run / "curves.png").stat().st_size > 10_000
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 150
    assert {"time/weight_sync_s", "buffer/sampled_policy_age_mean"} <= set(steps[-1])
    # A step trained only on groups rolled out before it began logs no rollout metrics.
    assert sum("rollout/reward" in r for r in steps) >= 75
    assert max(r["buffer/sampled_policy_age_mean"] for r in steps) <= 1.0  # max_policy_age


def test_killed_run_resumes_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    args = [
        "--config",
        CONFIG,
        "--run-dir",
        str(run),
        "sft.steps=30",
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
