"""The sandbox's supervisor: run as a script, standard library only (``forge.envs.sandbox``).

    python -I -S _sandbox_boot.py <address space> <cpu s> <file size> <processes> <status fd>
        <namespace: 1 or 0> <parent pid> <wall-clock s> <temporary dir>... -- <argv>

It sets the resource limits (they survive ``fork`` and ``exec``), then:

1. where the kernel lets an unprivileged process, moves into a new user and PID namespace
   (``unshare(CLONE_NEWUSER | CLONE_NEWPID)``): the program it starts is process 1 of that
   namespace, so when it exits or is killed the kernel kills every process in the namespace,
   however they detached (``setsid``, double ``fork``), and none of them can see or signal a
   process outside it;
2. either way, becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``), so that every orphaned
   descendant is re-parented to it rather than to init; then forks and execs ``argv``;
3. waits for that child, and then kills (``SIGKILL``) every process still below it, again and
   again until none is left. It does the same at once when the wall-clock limit passes (its
   own timer: the limit holds whatever becomes of the caller), on ``SIGTERM`` (the caller's
   own bound, should the supervisor be late), and when its parent dies (``SIGTERM`` again, by
   ``PR_SET_PDEATHSIG``: an actor SIGKILLed mid-call); in that last case it also removes the
   temporary directories the caller would have removed. The program it starts dies with it
   (``PR_SET_PDEATHSIG``, ``SIGKILL``), so a supervisor killed outright still takes the
   namespace's process 1, and with it the namespace, along.

It writes the program's ending to the status pipe: its exit code, or minus the signal that
killed it (``-9`` when killed at the timeout), and whether the timeout ended it (``1``/``0``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import sys
import time

CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
REAP_ROUNDS_S = 5.0  # the kill loop's bound (a fork bomb held by RLIMIT_NPROC ends sooner)


def _own_task_count() -> int:
    """Threads of processes whose real uid is ours, now: what ``RLIMIT_NPROC`` counts on Linux
    (every thread of every process of the user, not just ours). Read from
    ``/proc/<pid>/status``, which shows the owner even of a non-dumpable process (whose
    ``/proc/<pid>`` belongs to root)."""
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields.get("Threads", "1"))
        except (OSError, KeyError, ValueError):
            pass
    return n


def _children() -> list[int]:
    me, out = os.getpid(), []
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            return _children_by_scan(me)
    return out


def _children_by_scan(me: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree() -> None:
    """SIGKILL every process below this one until none is left (bounded in time)."""
    deadline = time.monotonic() + REAP_ROUNDS_S
    while time.monotonic() < deadline:
        _reap()
        kids = _children()
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)  # let the killed ones' orphans be re-parented to us


def _enter_namespace(libc) -> bool:
    """A new user and PID namespace for the children to come; False where not allowed
    (user namespaces off or restricted): then the subreaper alone holds the tree."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return False
    # Map our own uid and gid to themselves, so the program sees who it is.
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError:
            pass
    return True


def main(argv: list[str]) -> None:
    end = argv.index("--")
    mem, cpu, fsize, nproc, status_fd, namespace, parent = (int(a) for a in argv[:7])
    wall_s, temp_dirs, program = float(argv[7]), argv[8:end], argv[end + 1 :]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit = _own_task_count() + nproc  # the uid's threads now, plus the program's share
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    libc = ctypes.CDLL(None, use_errno=True)
    if namespace:
        _enter_namespace(libc)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def finish(code: int, timed_out: bool) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGALRM})
        kill_tree()
        if os.getppid() != parent:  # the caller died: nobody else will remove them
            for d in temp_dirs:
                shutil.rmtree(d, ignore_errors=True)
        _report(status_fd, code, timed_out)

    def stop(*_):  # the timeout, the caller's bound or its death: the program ends as SIGKILLed
        finish(-signal.SIGKILL, True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above
        stop()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() in (me, 0):  # 0: process 1 of its namespace, whose parent is outside
                os.execv(program[0], program)
        finally:
            os._exit(127)
    signal.setitimer(signal.ITIMER_REAL, wall_s)  # (a child does not inherit a timer)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    finish(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status), False)


def _report(fd: int, code: int, timed_out: bool) -> None:
    try:
        os.write(fd, f"{code} {int(timed_out)}\n".encode())
    except OSError:  # the caller is gone
        pass
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
