"""Runtime micro-benchmarks, side by side in one run.

    python -m benchmarks.runtime [--calls 2000] [--repeats 5]

Measures: a raw multiprocessing Pipe ping-pong (the floor for a cross-process round trip);
Forge ``call_one`` no-op round trip (median, p99); pipelined throughput with 64 calls in
flight; a 100 MB tensor argument round trip; a 100 MB memcpy (the floor: a round trip moves
the bytes at least twice) and, for reference, a memcpy into freshly allocated memory (page
faults included); and the same calls on torchmonarch when it is installed. The last line is machine-readable:
``call_vs_pipe=<x> call_vs_monarch=<x> tensor_vs_memcpy=<x>``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time

import torch

from benchmarks.common import fmt_ms, fmt_us, summarize, time_async, time_sync
from controller import Actor, endpoint, loops, shutdown

MB100 = 25 * 1024 * 1024  # fp32 elements in 100 MB


class Echo(Actor):
    @endpoint
    async def noop(self) -> None:
        return None

    @endpoint
    async def echo(self, x):
        return x


def _pipe_child(conn) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(msg)


def bench_pipe(n: int) -> list[float]:
    parent, child = mp.Pipe()
    p = mp.get_context("spawn").Process(target=_pipe_child, args=(child,), daemon=True)
    p.start()

    def rt():
        parent.send(b"x")
        parent.recv()

    times = time_sync(rt, n, warmup=100)
    parent.send(None)
    p.join(5)
    return times


def bench_memcpy(repeats: int, fresh: bool) -> list[float]:
    """memcpy of 100 MB: into preallocated memory (the floor), or into fresh memory."""
    src = torch.randn(MB100)
    if fresh:
        return time_sync(lambda: torch.empty_like(src).copy_(src), repeats, warmup=1)
    dst = torch.empty_like(src)
    return time_sync(lambda: dst.copy_(src), repeats, warmup=1)


async def bench_forge(n: int, repeats: int) -> dict:
    echo = await Echo.as_actor()
    call = await time_async(lambda: echo.noop.call_one(), n, warmup=200)
    tputs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(max(1, n // 64)):
            await asyncio.gather(*(echo.noop.call_one() for _ in range(64)))
        tputs.append(max(1, n // 64) * 64 / (time.perf_counter() - t))
    t100 = torch.randn(MB100)
    tensor = await time_async(lambda: echo.echo.call_one(t100), repeats, warmup=1)
    await shutdown()
    return {"call": call, "tput": tputs, "tensor": tensor}


async def bench_monarch(n: int, repeats: int) -> dict | None:
    try:
        from monarch.actor import Actor as MActor
        from monarch.actor import endpoint as mendpoint
        from monarch.actor import this_host
    except ImportError:
        return None

    class MEcho(MActor):
        @mendpoint
        async def noop(self) -> None:
            return None

        @mendpoint
        async def echo(self, x):
            return x

    procs = this_host().spawn_procs(per_host={"procs": 1})
    m = procs.spawn("echo", MEcho)
    n = max(50, n // 10)  # Monarch is ~10x slower per call; keep the run short
    call = await time_async(lambda: m.noop.call_one(), n, warmup=20)
    tputs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(max(1, n // 64)):
            await asyncio.gather(*(m.noop.call_one() for _ in range(64)))
        tputs.append(max(1, n // 64) * 64 / (time.perf_counter() - t))
    t100 = torch.randn(MB100)
    tensor = await time_async(lambda: m.echo.call_one(t100), max(2, repeats // 2), warmup=1)
    await procs.stop()
    return {"call": call, "tput": tputs, "tensor": tensor}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-monarch", action="store_true")
    args = ap.parse_args()

    pipe = summarize(bench_pipe(args.calls))
    memcpy = statistics.median(bench_memcpy(args.repeats * 2, fresh=False))
    memcpy_fresh = statistics.median(bench_memcpy(args.repeats, fresh=True))
    forge = loops.run(bench_forge(args.calls, args.repeats))
    monarch = None if args.no_monarch else loops.run(bench_monarch(args.calls, args.repeats))

    fc = summarize(forge["call"])
    print(
        f"{'pipe round trip (floor)':40s} median {fmt_us(pipe['median'])}  p99 {fmt_us(pipe['p99'])}"
    )
    print(f"{'forge call_one no-op':40s} median {fmt_us(fc['median'])}  p99 {fmt_us(fc['p99'])}")
    print(
        f"{'forge pipelined (64 in flight)':40s} {statistics.median(forge['tput']):10.0f} calls/s"
    )
    ft = statistics.median(forge["tensor"])
    print(f"{'memcpy 100 MB (floor)':40s} median {fmt_ms(memcpy)}")
    print(f"{'memcpy 100 MB into fresh memory':40s} median {fmt_ms(memcpy_fresh)}")
    print(f"{'forge 100 MB tensor round trip':40s} median {fmt_ms(ft)}")
    call_vs_monarch = float("nan")
    if monarch is not None:
        mc = summarize(monarch["call"])
        mt = statistics.median(monarch["tensor"])
        print(
            f"{'monarch call_one no-op':40s} median {fmt_us(mc['median'])}  p99 {fmt_us(mc['p99'])}"
        )
        print(
            f"{'monarch pipelined (64 in flight)':40s} {statistics.median(monarch['tput']):10.0f} calls/s"
        )
        print(
            f"{'monarch 100 MB tensor round trip':40s} median {fmt_ms(mt)}  (forge is {mt / ft:.1f}x faster)"
        )
        call_vs_monarch = fc["median"] / mc["median"]
    else:
        print("monarch: not installed (pip install 'forge[monarch]')")
    print(
        f"call_vs_pipe={fc['median'] / pipe['median']:.2f} "
        f"call_vs_monarch={call_vs_monarch:.2f} "
        f"tensor_vs_memcpy={ft / (2 * memcpy):.2f}"
    )


if __name__ == "__main__":
    main()
