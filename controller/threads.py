"""A per-host budget of compute threads, handed between the processes that need them.

Actors that run heavy torch work (a generator's decode steps, a trainer's forward/backward)
wrap each piece of work in ``with compute():``. Inside, the process counts as *busy* in a small
table in shared memory that every process on the host sees, and the calling thread runs with
its share of the host's cores:

    share = max(1, free // busy)      free = cores - load from everything else (rounded)

so a component working alone (an on-policy generation phase, an evaluation) gets every core,
two working at once split them, and more busy components than cores get one thread each (never
oversubscribing on purpose). "Everything else" is CPU time spent on the host in the last
half second by processes that are not busy budget holders (a reward function, another job, a
test suite), measured from ``/proc``: on a loaded machine the share shrinks instead of fighting
the load with spinning OpenMP threads. Long work re-checks its share with ``rebalance()`` (a
trainer between micro-batches, a generator every decode step), so when a neighbour finishes the
remaining work widens to the freed cores.

The table is one file in ``/dev/shm`` per user (``forge-threads-<uid>``): 512 slots of
``(pid, busy)`` int64 pairs. A process claims a slot on first use under an ``flock`` (slots of
dead processes are reclaimed), then writes only its own slot, so reads and writes need no lock.
A process that dies while busy is skipped once its pid is gone.

``FORGE_THREAD_BUDGET=0`` turns the budget off (``compute()`` then leaves torch's thread count
alone); ``FORGE_HOST_CORES=N`` overrides the core count (default: the CPUs this process may run
on, capped by a cgroup CPU quota).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Iterator

from controller import env_vars
from controller._runtime import pid_alive

__all__ = ["ThreadBudget", "compute", "get_budget", "host_cores"]

SLOTS = 512
_SLOT_BYTES = 16  # (pid, busy) as two little-endian int64
_LOAD_WINDOW_S = 0.5  # how often (and over how long) the load from others is re-measured
_HZ = os.sysconf("SC_CLK_TCK")


def host_cores() -> int:
    """Cores this process may use: ``FORGE_HOST_CORES``, else its CPU affinity, capped by a
    cgroup v2 CPU quota (``cpu.max``) when one is set."""
    forced = env_vars.host_cores()
    if forced is not None:
        return forced
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _enabled() -> bool:
    return env_vars.thread_budget()


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (``None`` if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ
    except (OSError, IndexError, ValueError):
        return None


def _host_busy_s() -> tuple[float, float]:
    """(busy CPU seconds summed over all CPUs, wall clock) from ``/proc/stat``."""
    with open("/proc/stat", "rb") as f:
        cpu = f.readline().split()[1:]
    ticks = [int(x) for x in cpu[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / _HZ, time.monotonic()


class ThreadBudget:
    """This process's view of the host's thread budget. Use the process-wide one through
    :func:`compute` / :func:`get_budget`; a separate instance (``path=``) is for tests."""

    def __init__(
        self, path: str | None = None, cores: int | None = None, measure_load: bool = True
    ) -> None:
        self.path = path or f"/dev/shm/forge-threads-{os.getuid()}"
        self.cores = cores or host_cores()
        self.measure_load = measure_load  # False: ignore load from other processes
        self.enabled = _enabled()
        self._slot: int | None = None
        self._mm: mmap.mmap | None = None
        self._depth = 0  # nested compute() blocks in this process
        self._lock = threading.Lock()
        self._other_load = 0.0  # cores used by everything but busy budget holders
        self._sample: tuple[float, float, dict[int, float]] | None = None

    # ---- the table ----------------------------------------------------------------------

    def _table(self) -> mmap.mmap:
        if self._mm is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < SLOTS * _SLOT_BYTES:
                    os.ftruncate(fd, SLOTS * _SLOT_BYTES)
                self._mm = mmap.mmap(fd, SLOTS * _SLOT_BYTES)
                self._slot = self._claim(fd, self._mm)
            finally:
                os.close(fd)
        return self._mm

    def _claim(self, fd: int, mm: mmap.mmap) -> int:
        """A free slot (empty, or its pid is gone), taken under an exclusive flock."""
        me = os.getpid()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for i in range(SLOTS):
                pid = int.from_bytes(mm[i * 16 : i * 16 + 8], "little")
                if pid == me or pid == 0 or not pid_alive(pid):
                    mm[i * 16 : i * 16 + 16] = me.to_bytes(8, "little") + bytes(8)
                    return i
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        raise RuntimeError(
            f"the thread budget table {self.path} has no free slot ({SLOTS} live processes); "
            "set FORGE_THREAD_BUDGET=0 to run without it"
        )

    def _set_busy(self, busy: bool) -> None:
        mm = self._table()
        off = self._slot * 16 + 8  # pyright: ignore[reportOptionalOperand]  # _table() set it
        mm[off : off + 8] = (1 if busy else 0).to_bytes(8, "little")

    def busy_pids(self) -> list[int]:
        """Pids of the processes on this host that are inside ``compute()`` now."""
        table = self._rows()
        pids = table[(table[:, 1] != 0) & (table[:, 0] != 0), 0].tolist()
        me = os.getpid()
        return [pid for pid in pids if pid == me or pid_alive(pid)]

    def _rows(self):
        import numpy as np

        return np.frombuffer(self._table(), dtype="<i8").reshape(SLOTS, 2).copy()

    # ---- the share ----------------------------------------------------------------------

    def share(self) -> int:
        """Threads this process should use now (it counts itself as busy)."""
        busy = self.busy_pids()
        if os.getpid() not in busy:
            busy.append(os.getpid())
        n, rank = len(busy), sorted(busy).index(os.getpid())
        other = self._measure_other_load() if self.measure_load else 0.0
        free = max(n, self.cores - round(other))
        # cores // n each; the first (cores % n) busy processes by pid take the remainder.
        return max(1, free // n + (1 if rank < free % n else 0))

    def holder_pids(self) -> list[int]:
        """Pids of every process that holds a slot (busy or not)."""
        table = self._rows()
        return table[table[:, 0] != 0, 0].tolist()

    def _measure_other_load(self) -> float:
        """Cores used over the last window by processes that are not budget holders."""
        now = time.monotonic()
        prev = self._sample
        if prev is None or now - prev[1] >= _LOAD_WINDOW_S:
            host_s, now = _host_busy_s()
            holders = self.holder_pids()
            mine = {pid: s for pid in holders if (s := _proc_cpu_s(pid)) is not None}
            if prev is not None:
                dt = now - prev[1]
                holders = sum(s - prev[2][p] for p, s in mine.items() if p in prev[2])
                self._other_load = max(0.0, (host_s - prev[0] - holders) / dt)
            self._sample = (host_s, now, mine)
        return self._other_load

    def _apply(self) -> int:
        import torch

        n = self.share()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n

    # ---- the public part ----------------------------------------------------------------

    @contextlib.contextmanager
    def compute(self) -> Iterator[int]:
        """Run the block as busy with this process's share of the cores (yielded); the
        calling thread's torch thread count is set to it."""
        if not self.enabled:
            import torch

            yield torch.get_num_threads()
            return
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._set_busy(True)
        try:
            yield self._apply()
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._set_busy(False)

    def rebalance(self) -> int:
        """Inside ``compute()``: re-read the share (neighbours may have started or finished)
        and apply it to the calling thread. Cheap (tens of microseconds)."""
        if not self.enabled or self._depth == 0:
            import torch

            return torch.get_num_threads()
        return self._apply()

    def close(self) -> None:
        """Give the slot back (done automatically when the process exits and its pid goes)."""
        if self._mm is not None and self._slot is not None:
            self._mm[self._slot * 16 : self._slot * 16 + 16] = bytes(16)
            self._mm.close()
            self._mm, self._slot = None, None


_budget: ThreadBudget | None = None


def get_budget() -> ThreadBudget:
    """This process's thread budget (created on first use)."""
    global _budget
    if _budget is None:
        _budget = ThreadBudget()
    return _budget


def compute() -> contextlib.AbstractContextManager[int]:
    """``with compute() as threads:``: heavy torch work with this process's share of the
    host's cores. See the module docstring."""
    return get_budget().compute()
