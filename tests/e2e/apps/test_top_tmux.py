"""``forge top`` in a real terminal: the CPU demo runs in one tmux window, ``forge top`` in
another; the captured screen shows the services and replicas and a step count that
advances, then the run marked finished."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO, script_env

CONFIG = str(REPO / "apps/sumdigits/cpu.yaml")
STEPS = 40


def _tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"tmux {' '.join(args[:1])} failed: {out.stderr.strip()}"
    return out.stdout


def _wait(cond, timeout: float, what: str, show=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{show()}")
        time.sleep(0.5)


def _grpo_step(status: Path) -> int:
    try:
        rl = json.loads(status.read_text())["extra"].get("rl") or {}
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0
    return rl.get("step", 0) if rl.get("stage") == "rl" else 0


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_forge_top_follows_the_cpu_demo_in_tmux(tmp_path):
    run, log = tmp_path / "run", tmp_path / "run.log"
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    envs = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("PYTHONPATH", "FORGE_CACHE_DIR"))
    py = shlex.quote(sys.executable)
    demo = (
        f"cd {shlex.quote(str(REPO))} && env {envs} {py} -m forge.cli run --config {CONFIG} "
        f"--run-dir {run} sft.steps=20 rl.steps={STEPS} rl.eval.at_start=false "
        f"rl.eval.every=0 > {log} 2>&1; sleep 300"
    )
    # tmux may hand its panes COLUMNS=80 LINES=24 (seen when started from pytest), which rich
    # would believe over the pane's real size
    top = (
        f"cd {shlex.quote(str(REPO))} && env -u COLUMNS -u LINES {envs} {py} -m forge.cli top "
        f"{run}; sleep 300"
    )
    sock = f"forge-top-test-{uuid.uuid4().hex[:8]}"
    _tmux(sock, "new-session", "-d", "-s", "t", "-x", "160", "-y", "50", demo)
    try:
        _wait(lambda: _grpo_step(run / "status.json") >= 1, 400, "the demo's first GRPO step")
        _tmux(sock, "new-window", "-t", "t:1", top)  # "t" alone once resolved to window 0
        _tmux(sock, "resize-window", "-t", "t:1", "-x", "160", "-y", "50")
        size = _tmux(sock, "display-message", "-p", "-t", "t:1", "#{pane_width}x#{pane_height}")
        assert size.strip() == "160x50", size

        def show() -> str:
            screen = _tmux(sock, "capture-pane", "-p", "-t", "t:1")
            return f"screen:\n{screen}\nrun log (end):\n{log.read_text()[-3000:]}"

        def screen_step() -> tuple[str, int] | None:
            screen = _tmux(sock, "capture-pane", "-p", "-t", "t:1")
            m = re.search(rf"step (\d+)/{STEPS}", screen)
            drawn = "╰" in screen  # the bottom border: the frame is not caught mid-redraw
            return (screen, int(m.group(1))) if m and drawn else None

        wants = ("RUNNING", "Generator", "RewardActor", "healthy", "Trainer", "reward")

        weights = r"trainer v\d+\s+generator r0 v\d+"

        def full_screen() -> tuple[str, int] | None:
            # The reward row appears with the first step whose metrics carry the rollouts'
            # rewards (they are flushed off the critical path, a step or so late); the
            # generator's version once its load of the pushed weights ends (it overlaps the
            # next step, so a frame may show the trainer's version alone).
            got = screen_step()
            ok = got and all(w in got[0] for w in wants) and re.search(weights, got[0])
            return got if ok else None

        what = f"forge top to draw a step count, {wants} and the served versions"
        screen, first = _wait(full_screen, 90, what, show)
        _, later = _wait(
            lambda: (s := screen_step()) and s[1] > first and s, 120, "the step to advance", show
        )
        assert first < later <= STEPS

        def finished():
            s = _tmux(sock, "capture-pane", "-p", "-t", "t:1")
            return s if "FINISHED" in s else None

        screen = _wait(finished, 300, "the run to finish on screen", show)
        assert f"step {STEPS}/{STEPS}" in screen and "last eval" in screen, show()
        assert "heldout_accuracy=" in log.read_text()
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)
