"""A process of the same user that tries to take the session's secret from the actor processes
and zygotes below a controller, from the moment each one appears (run as a script, standard
library only; ``test_session_key_thief.py`` starts it).

    python key_thief.py <controller pid> <file with the key, hex> <stop file> <report file>

Until the stop file exists (or 300 s have passed) it walks the controller's descendants (not
the controller itself, whose memory holds the secret: docs/security.md) and, for each:

- opens every ``/proc/<pid>/fd/<n>``: a pipe opened that way is the same pipe, so it reads
  what is waiting in it and writes it back (the owner reads it as if nothing happened);
- reads the private writable mappings of ``/proc/<pid>/mem`` (once per process per second)
  and looks for the secret, in hex and raw; not in a fork of the controller that has not yet
  run ``exec`` (its command line is the controller's): that memory is the controller's.
  The kernel checks access to ``mem`` when it is opened, not at each read: a read that began
  while the process was open and found the secret after it closed (``mem_late``) is the
  attacker docs/security.md describes that may ptrace the user's processes and keeps what it
  opened in a plain worker's first moments (as it could hold the controller's); it is
  counted apart from ``found``, which is what an attacker obtains by reading what is open.

It writes a JSON report: each process it saw (``procs``: pid -> its parent's pid, when it was
first seen and when it was last open to the thief, a descriptor opened or its memory read,
``null`` if never; times in seconds on the thief's clock), counts of what it opened and read,
and where it found the secret (``found``; empty when the secret was safe).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time

MEM_EVERY_S = 1.0
MEM_LIMIT = 64 << 20  # bytes read from one process's memory per look


def descendants(root: int) -> set[int]:
    """Every process below ``root`` (children of each thread, recursively)."""
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


class Thief:
    def __init__(self, key_hex: str, controller: bytes | None):
        self.controller = controller  # its command line
        self.needles = (key_hex.encode(), bytes.fromhex(key_hex))
        self.procs: dict[int, dict] = {}
        self.last_mem: dict[int, float] = {}
        self.counts = {
            "fd_opened": 0,
            "fd_denied": 0,
            "pipe_bytes": 0,
            "mem_read": 0,
            "mem_denied": 0,
            "mem_late": 0,
        }
        self.found: list[str] = []

    def look(self, pid: int) -> None:
        if pid not in self.procs:
            self.procs[pid] = {
                "ppid": _ppid(pid),
                "first_seen": time.monotonic(),
                "last_open": None,
            }
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            self.counts["fd_denied"] += 1
            fds = []
        for fd in fds:
            self._steal_pipe(pid, f"/proc/{pid}/fd/{fd}")
        now = time.monotonic()
        if now - self.last_mem.get(pid, 0.0) >= MEM_EVERY_S:
            self.last_mem[pid] = now
            self._read_mem(pid)

    def _opened(self, pid: int) -> None:
        self.procs[pid]["last_open"] = time.monotonic()

    def _steal_pipe(self, pid: int, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:  # a socket: allowed in, but it cannot be opened
                self._opened(pid)
            else:
                self.counts["fd_denied"] += 1
            return
        self.counts["fd_opened"] += 1
        self._opened(pid)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            self.counts["pipe_bytes"] += len(data)
            if any(n in data for n in self.needles):
                self.found.append(f"pipe {path}")
            w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # put it back: nobody notices
            try:
                os.write(w, data)
            finally:
                os.close(w)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _read_mem(self, pid: int) -> None:
        before = _cmdline(pid)
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read().splitlines()
            mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            self.counts["mem_denied"] += 1
            return
        try:
            if before == self.controller or _cmdline(pid) != before:
                return  # a fork of the controller before its exec: the controller's memory
            self.counts["mem_read"] += 1
            self._opened(pid)
            budget = MEM_LIMIT
            for start, end in _private_writable(maps):
                try:
                    data = os.pread(mem, min(end - start, budget), start)
                except OSError:
                    continue
                budget -= len(data)
                if any(n in data for n in self.needles):
                    if _mem_open(pid):
                        self.found.append(f"mem of pid {pid}")
                    else:  # it closed while this read went on (see the module docstring)
                        self.counts["mem_late"] += 1
                    return
                if budget <= 0:
                    return
        finally:
            os.close(mem)


def _mem_open(pid: int) -> bool:
    """Whether ``/proc/<pid>/mem`` can be opened now."""
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
    except OSError:
        return False
    return True


def _private_writable(maps: list[str]) -> list[tuple[int, int]]:
    """The (start, end) of each private writable mapping in ``/proc/<pid>/maps`` lines (heap,
    anonymous memory, a module's data), where a process keeps what it computed."""
    out = []
    for line in maps:
        parts = line.split()
        if len(parts) < 2 or not parts[1].startswith("rw") or parts[1][3] != "p":
            continue
        if len(parts) > 5 and parts[5].startswith("[v"):  # [vvar], [vsyscall]
            continue
        start, end = parts[0].split("-")
        out.append((int(start, 16), int(end, 16)))
    return out


def main(root: int, key_path: str, stop_path: str, report_path: str) -> None:
    with open(key_path) as f:
        thief = Thief(f.read().strip(), _cmdline(root))
    deadline = time.monotonic() + 300
    print("watching", flush=True)
    while not os.path.exists(stop_path) and time.monotonic() < deadline:
        for pid in descendants(root):
            thief.look(pid)
        time.sleep(0.001)
    report = {"procs": thief.procs, "found": sorted(set(thief.found)), **thief.counts}
    with open(report_path + ".tmp", "w") as f:
        json.dump(report, f)
    os.rename(report_path + ".tmp", report_path)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
