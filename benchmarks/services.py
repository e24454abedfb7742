"""Service benchmarks: routing overhead, replica scaling, failover, side by side in one run.

    python -m benchmarks.services [--calls 2000] [--repeats 5] [--seconds 2] [--trials 5]

Measures, on ``Cls.options(num_replicas=N).as_service()`` services (see docs/services.md):

- **route overhead**: ``svc.noop.route()`` on a one-replica service against ``call_one`` on a
  plain one-process actor of the same class, no-op async endpoint, sequential calls. The two
  are measured in alternating rounds (so load from other processes hits both alike); the
  ratio is of the medians of the per-round medians. Also counted: event-loop iterations per
  call (deterministic, unlike latency on a shared machine).
- **throughput vs replicas**: calls/s of a 10 ms endpoint with 1, 2, 4 and 8 replicas (grown
  with ``scale``), ``--callers`` concurrent callers (default: enough to fill every replica's
  ``replica_max_concurrent_requests`` slots twice over). Two variants: an ``async`` endpoint
  that awaits ``asyncio.sleep(0.01)`` (waiting, no CPU) and a plain ``def`` endpoint that
  busy-loops for 10 ms (CPU-bound; the machine's cores are the ceiling).
- **failover**: a request is routed to a replica whose endpoint blocks; that replica's process
  is SIGKILLed; the time from the kill to the request completing on another replica (the
  retry finds the marker file and returns at once, so this is death detection + re-send).

The last line is machine-readable: ``route_overhead=<ratio> failover_ms=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt_us, time_async
from controller import Actor, endpoint, loops, shutdown

REPLICA_COUNTS = (1, 2, 4, 8)
WORK_S = 0.01


class Worker(Actor):
    @endpoint
    async def noop(self) -> None:
        return None

    @endpoint
    async def sleep_10ms(self) -> None:
        await asyncio.sleep(WORK_S)

    @endpoint
    def spin_10ms(self) -> None:
        # Plain ``def``: runs on the actor's thread pool and holds the GIL while spinning.
        # The deadline is in this thread's CPU time: a wall-clock deadline would count time
        # spent descheduled as work, and more replicas than cores would look like they scale.
        end = time.thread_time() + WORK_S
        while time.thread_time() < end:
            pass

    @endpoint
    async def block_once(self, marker: str) -> int:
        """The first caller creates ``marker`` (with its pid) and blocks; later calls return."""
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return os.getpid()
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        await asyncio.sleep(3600)
        return os.getpid()


async def bench_route_overhead(calls: int, repeats: int) -> dict:
    actor = await Worker.as_actor()
    svc = await Worker.options(num_replicas=1).as_service()
    one, route = [], []
    per_round = max(100, calls // repeats)
    for _ in range(repeats):
        one.append(statistics.median(await time_async(actor.noop.call_one, per_round, 50)))
        route.append(statistics.median(await time_async(svc.noop.route, per_round, 50)))
    iters = {
        "call_one": await loop_iterations(actor.noop.call_one),
        "route": await loop_iterations(svc.noop.route),
    }
    await svc.shutdown()
    await actor.shutdown()
    return {"call_one": statistics.median(one), "route": statistics.median(route), "iters": iters}


async def loop_iterations(fn, n: int = 500) -> float:
    """Event-loop iterations per sequential call: a cost count that load does not disturb.

    Each iteration is an ``epoll`` wait plus callback dispatch (most of a no-op call's
    controller-side time), so a layer that adds iterations adds latency. Counted by wrapping
    the loop's private ``_run_once``; benchmark-only; ``nan`` on uvloop (``FORGE_UVLOOP=0``
    runs the benchmark on asyncio's loop).
    """
    loop = asyncio.get_running_loop()
    if not hasattr(loop, "_run_once"):
        return float("nan")  # uvloop: its loop runs in C, with nothing to wrap
    count = 0
    run_once = loop._run_once

    def counted():
        nonlocal count
        count += 1
        run_once()

    await fn()
    loop._run_once = counted
    try:
        for _ in range(n):
            await fn()
    finally:
        del loop._run_once  # back to the class's method
    return count / n


async def _throughput(ep, callers: int, seconds: float) -> float:
    """Calls/s with ``callers`` tasks each calling ``ep.route()`` back to back."""
    done = 0
    stop = time.perf_counter() + seconds

    async def caller():
        nonlocal done
        while time.perf_counter() < stop:
            await ep.route()
            done += 1

    t = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done / (time.perf_counter() - t)


async def bench_scaling(repeats: int, seconds: float, callers: int | None) -> dict:
    svc = await Worker.options(num_replicas=1).as_service()
    cap = svc.config.replica_max_concurrent_requests
    out: dict[str, dict[int, float]] = {"sleep": {}, "spin": {}}
    for n in REPLICA_COUNTS:
        await svc.scale(n)
        k = callers or 2 * cap * n
        for name, ep in (("sleep", svc.sleep_10ms), ("spin", svc.spin_10ms)):
            await _throughput(ep, k, 0.3)  # warm the new replicas' connections
            out[name][n] = statistics.median(
                [await _throughput(ep, k, seconds) for _ in range(repeats)]
            )
    await svc.shutdown()
    out["cap"] = cap
    return out


async def _all_healthy(svc, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = svc.metrics()
        if len(m) == n and all(r["state"] == "healthy" for r in m.values()):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"replicas did not come back healthy: {svc.metrics()}")


async def bench_failover(trials: int) -> list[float]:
    svc = await Worker.options(num_replicas=2).as_service()
    await svc.noop.fanout()
    times = []
    with tempfile.TemporaryDirectory(prefix="forge-failover-") as tmp:
        for i in range(trials):
            await _all_healthy(svc, 2)
            marker = os.path.join(tmp, f"m{i}")
            task = asyncio.ensure_future(svc.block_once.route(marker))
            while not (os.path.exists(marker) and os.path.getsize(marker)):
                await asyncio.sleep(0.001)
            victim = int(Path(marker).read_text())
            t = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
            served_by = await task
            times.append(time.perf_counter() - t)
            assert served_by != victim, "the retried request came back from the killed replica"
    await svc.shutdown()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls per variant")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    ap.add_argument("--callers", type=int, default=None, help="default: 2 x cap x replicas")
    ap.add_argument("--trials", type=int, default=5, help="failover trials")
    args = ap.parse_args()

    async def run():
        over = await bench_route_overhead(args.calls, args.repeats)
        await shutdown()
        scaling = await bench_scaling(args.repeats, args.seconds, args.callers)
        fail = await bench_failover(args.trials)
        await shutdown()
        return over, scaling, fail

    over, scaling, fail = loops.run(run())
    ratio = over["route"] / over["call_one"]
    print(f"{'call_one no-op (plain actor)':40s} median {fmt_us(over['call_one'])}")
    print(f"{'route no-op (1-replica service)':40s} median {fmt_us(over['route'])}")
    print(f"{'route / call_one':40s} {ratio:8.2f}x")
    it = over["iters"]
    print(
        f"{'event-loop iterations per call':40s} call_one {it['call_one']:.1f}  "
        f"route {it['route']:.1f}"
    )
    cores = os.cpu_count()
    print(f"throughput, calls/s ({cores} cores; cap {scaling['cap']} in flight per replica):")
    print(f"  {'replicas':>8s} {'async sleep 10 ms':>18s} {'cpu spin 10 ms':>16s}")
    for n in REPLICA_COUNTS:
        print(f"  {n:8d} {scaling['sleep'][n]:18.0f} {scaling['spin'][n]:16.0f}")
    fail_ms = 1e3 * statistics.median(fail)
    print(
        f"{'failover kill -> request done':40s} median {fail_ms:8.1f} ms  "
        f"(min {1e3 * min(fail):.1f}, max {1e3 * max(fail):.1f}, n={len(fail)})"
    )
    print(f"route_overhead={ratio:.2f} failover_ms={fail_ms:.0f}")


if __name__ == "__main__":
    main()
