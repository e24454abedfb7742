"""No orphans: however the controller ends, every actor process is gone within 5 s."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, script_env, wait_dead, write_script

CONTROLLER = """
import asyncio, sys
from controller import shutdown
from tests.integration.controller.actors import Caller, Counter

async def main():
    c = await Counter.options(procs=2).as_actor()
    parent = await Caller.as_actor()
    child_pids = await parent.spawn_child.call_one()   # a grandchild process
    pids = c.pids + parent.pids + child_pids
    print("PIDS", " ".join(map(str, pids)), flush=True)
    mode = sys.argv[1]
    if mode == "wait":
        await asyncio.sleep(300)
    elif mode == "raise":
        raise RuntimeError("controller crashed")
    # mode == "exit": fall off the end without calling shutdown()

asyncio.run(main())
"""


def _ignore_sigint() -> None:
    """What a shell does to a background job: SIGINT ignored, inherited across exec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(tmp_path, mode: str, sigint_ignored: bool = False):
    path = write_script(tmp_path, CONTROLLER)
    proc = subprocess.Popen(
        [sys.executable, str(path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=script_env(),
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("PIDS") or not line:
            break
    assert line.startswith("PIDS"), proc.stderr.read() if proc.poll() is not None else line
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 4
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_orphans_when_controller_is_signalled(tmp_path, sig):
    proc, pids = _start(tmp_path, "wait")
    proc.send_signal(sig)
    proc.wait(timeout=10)
    assert wait_dead(pids, 5.0) == [], f"orphans after {sig.name}"


def test_sigint_stops_a_controller_started_with_sigint_ignored(tmp_path):
    proc, pids = _start(tmp_path, "wait", sigint_ignored=True)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)
    assert wait_dead(pids, 5.0) == [], "orphans after SIGINT"


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_no_orphans_when_controller_exits(tmp_path, mode):
    proc, pids = _start(tmp_path, mode)
    rc = proc.wait(timeout=20)
    assert (rc == 0) == (mode == "exit")
    assert wait_dead(pids, 5.0) == []
