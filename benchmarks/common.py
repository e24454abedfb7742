"""Small timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
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
