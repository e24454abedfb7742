"""A reaper for processes that would outlive a killed controller.

Some processes a controller starts are not its children's children in a way that dies with it:
a local Ray instance's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) hang on after
their raylet when the controller is SIGKILLed. ``watch(pids)`` starts this module as a child
that reads a lifeline pipe from the controller; at end-of-file (the controller is gone, however
it went) it SIGKILLs every listed process that is still the same process (pid and start time
match: a reused pid is spared), then exits.

    python -m controller._reaper <lifeline fd> <pid>:<start time> ...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def watch(pids: list[int]) -> subprocess.Popen | None:
    """Start a reaper for ``pids`` that fires when this process dies (Linux only; ``None``
    elsewhere). Keep the returned handle alive for as long as the processes should live."""
    if not os.path.isdir("/proc"):
        return None
    marks = [f"{p}:{t}" for p in pids if (t := start_time(p)) is not None]
    life_r, life_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controller._reaper", str(life_r), *marks],
            pass_fds=(life_r,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C to the controller's group must not fire it early
            env={**os.environ, "PYTHONPATH": _package_root()},
        )
    finally:
        os.close(life_r)
    proc._forge_lifeline = life_w  # type: ignore[attr-defined]  # closed when we die
    return proc


def _package_root() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def main(argv: list[str]) -> None:
    fd, marks = int(argv[0]), argv[1:]
    while os.read(fd, 4096):  # nothing is ever written: this returns b"" when the writer dies
        pass
    for mark in marks:
        pid, _, started = mark.partition(":")
        if start_time(int(pid)) == started:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main(sys.argv[1:])
