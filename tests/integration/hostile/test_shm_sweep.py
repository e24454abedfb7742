"""The stale-session sweep: a root controller SIGKILLed with weight files of every kind in
/dev/shm (the run's prefix, a custom prefix, a relayed copy), and unrelated files whose names
merely contain ``forge-<pid>-``. The next session removes the first, never the second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

from controller import _runtime
from controller import _serialization as ser
from tests.helpers import REPO, pid_alive, script_env

DEAD_PID = 4_000_000  # above pid_max: never alive

KILLED_CONTROLLER = textwrap.dedent(
    """
    import dataclasses, os, sys, time, torch
    from controller import session_tag
    from controller._runtime import get_runtime
    from forge.weights.relay import _local_path
    from forge.weights.shm import SharedMemoryTransport

    get_runtime()
    run = SharedMemoryTransport(f"{session_tag()}-policy").push({"w": torch.ones(3)}, 1)
    custom = SharedMemoryTransport(sys.argv[1], spares=1)
    custom.push({"w": torch.ones(3)}, 1)
    custom.push({"w": torch.ones(3)}, 2)
    custom.drop(1)  # a spare
    relay = _local_path(dataclasses.replace(run, location="/dev/shm/x", uid="u1"))
    open(relay, "wb").write(b"relayed")
    open(relay + ".lock", "wb").close()
    print(get_runtime().session.dir, flush=True)
    time.sleep(60)
    """
)


def test_a_killed_sessions_files_are_swept_and_nothing_else(tmp_path):
    custom = f"hostile-sweep-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONTROLLER, custom],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=script_env(),
    )
    try:
        session_dir = proc.stdout.readline().strip()
        tag = os.path.basename(session_dir)
        assert session_dir and os.path.isdir(session_dir), "the session did not start"
        ours = sorted(n for n in os.listdir(ser.SHM_DIR) if tag in n or custom in n)
        assert any(custom in n and "-v2-" in n for n in ours), ours
        assert any(custom in n and "-spare-" in n for n in ours), ours
        assert any(n.startswith("forge-w-relay-u1-v1.") for n in ours), ours
        assert any(n.endswith(".lock") for n in ours), ours
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert not pid_alive(proc.pid)
    # Unrelated files that contain forge-<dead pid>- (in /tmp and in /dev/shm) and a
    # session name of a dead pid made by another user.
    bystanders = [
        os.path.join(tempfile.gettempdir(), f"myproj-forge-{proc.pid}-results"),
        os.path.join(ser.SHM_DIR, f"myproj-forge-{proc.pid}-results"),
        os.path.join(ser.SHM_DIR, f"notforge-w-x.forge-{proc.pid}-abcdefgh"),
    ]
    for path in bystanders:
        with open(path, "w") as f:
            f.write("keep me")
    try:
        _runtime._sweep_stale_sessions(tempfile.gettempdir())
        left = sorted(n for n in os.listdir(ser.SHM_DIR) if tag in n or custom in n)
        assert left == [], left
        assert not os.path.exists(session_dir)
        assert all(os.path.exists(p) for p in bystanders)
    finally:
        for path in bystanders:
            os.unlink(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_the_sweep_leaves_other_users_files(tmp_path, monkeypatch):
    monkeypatch.setattr(_runtime.ser, "SHM_DIR", None)
    theirs = tmp_path / f"forge-{DEAD_PID}-{_runtime.host_id()}-abcd1234"
    mine = tmp_path / f"forge-{DEAD_PID}-{_runtime.host_id()}-efgh5678"
    for d in (theirs, mine):
        d.mkdir()
        (d / _runtime.SESSION_MARK).write_text(d.name)  # both marked as Forge's own
    os.chown(theirs, 65534, 65534)
    _runtime._sweep_stale_sessions(str(tmp_path))
    assert theirs.exists() and not mine.exists()


def test_only_exact_session_names_are_judged(tmp_path, monkeypatch):
    monkeypatch.setattr(_runtime.ser, "SHM_DIR", None)
    me = _runtime.host_id()
    keep = [
        f"myproj-forge-{DEAD_PID}-results",
        f"forge-{DEAD_PID}-results",
        f"forge-{DEAD_PID}-{me}-abcd1234-extra",
        f"x-forge-{DEAD_PID}-{me}-abcd1234",
    ]
    for name in keep:
        (tmp_path / name).mkdir()
    session = tmp_path / f"forge-{DEAD_PID}-{me}-abcd1234"
    session.mkdir()
    (session / _runtime.SESSION_MARK).write_text(session.name)
    _runtime._sweep_stale_sessions(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
