"""A tour of Forge's actor runtime on this machine (the quick start's main job until the CPU
GRPO demo lands).

    python -m apps.runtime_demo.main

    controller ──call/choose/stream──▶ Worker mesh (2 processes)
         │                                  │
         └── 100 MB tensor via shared memory┘   then: SIGKILL rank 0, see the named error,
                                                 rank 1 keeps serving; shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import torch

from controller import Actor, ActorDiedError, ActorError, current_rank, endpoint, loops, shutdown


class Worker(Actor):
    """Sums tensors and reports where it runs."""

    def __init__(self, scale: float):
        self.factor = scale  # (not `scale`: a service handle's method, to a type checker)
        self.calls = 0

    @endpoint
    async def whoami(self) -> str:
        self.calls += 1
        return f"rank {current_rank().rank} pid {os.getpid()}"

    @endpoint
    async def weighted_sum(self, t: torch.Tensor) -> float:
        return float(t.sum()) * self.factor

    @endpoint
    async def slow(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return current_rank().rank

    @endpoint
    async def divide(self, a: float, b: float) -> float:
        return a / b


async def main() -> None:
    t0 = time.perf_counter()
    workers = await Worker.options(procs=2, mesh_name="workers").as_actor(scale=0.5)
    print(f"spawned {len(workers)} workers in {time.perf_counter() - t0:.2f} s: {workers.pids}")

    print("call     ->", (await workers.whoami.call()).values())
    print("choose   ->", await workers.whoami.choose())
    print("stream   ->", [r async for r in workers.slow.stream(0.1)])

    round_trips = 20_000
    t0 = time.perf_counter()
    one = workers.slice(procs=0)
    for _ in range(round_trips):
        await one.whoami.call_one()
    print(f"call_one -> {(time.perf_counter() - t0) / round_trips * 1e6:.0f} us per round trip")

    big = torch.ones(25 * 1024 * 1024)  # 100 MB
    await one.weighted_sum.call_one(big)  # first one also imports torch in the worker
    t0 = time.perf_counter()
    total = await one.weighted_sum.call_one(big)
    print(f"100 MB tensor -> {total:.0f} in {(time.perf_counter() - t0) * 1e3:.1f} ms")

    try:
        await one.divide.call_one(1.0, 0.0)
    except ActorError as e:
        print(f"remote error -> {e.remote_type}: {e.remote_message} (actor keeps serving)")

    victim = workers.pids[0]
    pending = one.slow.call_one(60).start()
    await asyncio.sleep(0.2)
    os.kill(victim, signal.SIGKILL)
    t0 = time.perf_counter()
    try:
        await pending
    except ActorDiedError as e:
        print(f"after SIGKILL ({(time.perf_counter() - t0) * 1e3:.0f} ms) -> {e}")
    print("rank 1 still serves ->", await workers.slice(procs=1).whoami.call_one())

    await shutdown()
    print("shutdown: all processes stopped")


if __name__ == "__main__":
    loops.run(main())
