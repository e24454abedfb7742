"""Small timing helpers shared by the benchmarks."""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections.abc import Awaitable, Callable


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarize(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "p99": percentile(xs, 0.99), "n": len(xs)}


def time_sync(fn: Callable[[], object], n: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


async def time_async(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


def fmt_us(s: float) -> str:
    return f"{s * 1e6:8.1f} us"


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:8.2f} ms"


# --------------------------------------------------------------------- CPU utilisation
def interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """The value at time ``t`` of a piecewise-linear series of ``(time, value)`` samples
    (sorted by time); ``t`` must lie within the samples' span."""
    if not samples or not samples[0][0] <= t <= samples[-1][0]:
        span = f"[{samples[0][0]:.3f}, {samples[-1][0]:.3f}]" if samples else "(no samples)"
        raise ValueError(f"time {t:.3f} is outside the sampled span {span}")
    i = bisect.bisect_left(samples, t, key=lambda s: s[0])
    t1, v1 = samples[i]
    if t1 == t or i == 0:
        return v1
    t0, v0 = samples[i - 1]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def utilisation(samples: list[tuple[float, float]], t0: float, t1: float, cores: int) -> float:
    """CPU seconds spent between ``t0`` and ``t1`` (interpolated from cumulative
    ``(time, cpu_seconds)`` samples) over the cores' capacity in that time: 1.0 = all busy."""
    if t1 <= t0:
        raise ValueError(f"empty window: t0={t0} >= t1={t1}")
    return (interpolate(samples, t1) - interpolate(samples, t0)) / ((t1 - t0) * cores)


class ProcessTreeCpu:
    """Samples the CPU seconds (user + system) spent by this process and all its descendants,
    every ``interval`` seconds on a background thread, as cumulative ``(perf_counter, seconds)``
    pairs in ``samples``.

    Each process is counted by its own ``cpu_times()`` (not ``children_*``, which only count
    waited-for children after they exit), keyed by ``(pid, create_time)``, and keeps its last
    reading after it exits, so the series never decreases; the CPU a process spends between
    its last sample and its exit is not counted. Use as a context manager; the first and last
    samples are taken on entry and exit::

        with ProcessTreeCpu() as cpu:
            t0 = time.perf_counter(); work(); t1 = time.perf_counter()
        print(utilisation(cpu.samples, t0, t1, os.cpu_count()))
    """

    def __init__(self, interval: float = 0.1):
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._root = psutil.Process()
        self._seen: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def sample(self) -> None:
        """Read the tree once and append ``(perf_counter, total CPU seconds)``."""
        ps = self._psutil
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except ps.Error:  # a child vanished while the tree was walked: keep the old readings
            procs = [self._root]
        for p in procs:
            try:
                with p.oneshot():
                    ct = p.cpu_times()
                    self._seen[(p.pid, p.create_time())] = ct.user + ct.system
            except ps.Error:  # exited (or a zombie) between the walk and the read
                continue
        self.samples.append((time.perf_counter(), sum(self._seen.values())))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> ProcessTreeCpu:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
