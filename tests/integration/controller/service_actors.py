"""Actors used by the service tests (importable, so they pickle by reference)."""

from __future__ import annotations

import asyncio
import os
import time

from controller import Actor, Router, endpoint


class Echo(Actor):
    def __init__(self, tag: str = "echo"):
        self.tag = tag
        self.recovered = False

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def echo(self, x, delay: float = 0.0):
        await asyncio.sleep(delay)
        return x

    @endpoint
    async def slow_pid(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()

    @endpoint
    async def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    async def on_recover(self) -> None:
        self.recovered = True

    @endpoint
    async def was_recovered(self) -> bool:
        return self.recovered

    @endpoint
    async def hang_once(self, marker: str) -> int:
        """The first call (the one that creates ``marker``) blocks this process's event loop
        for good; later calls, on any replica, answer with their pid."""
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return os.getpid()
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(3600)  # blocks the loop: no ping is answered
        return os.getpid()

    @endpoint
    def sync_sleep(self, seconds: float) -> int:
        """Legitimate long work in a ``def`` endpoint (runs in a thread, off the loop)."""
        time.sleep(seconds)
        return os.getpid()


class Caller(Actor):
    """Gets a service handle in an endpoint argument and calls through it."""

    def __init__(self):
        self.svc = None

    @endpoint
    async def keep(self, svc) -> str:
        self.svc = svc
        return type(svc).__name__

    @endpoint
    async def route_pids(self, n: int) -> list[int]:
        return [await self.svc.pid.route() for _ in range(n)]

    @endpoint
    async def fanout_pids(self) -> list[int]:
        return await self.svc.pid.fanout()

    @endpoint
    async def route_with(self, ep, x):
        """``ep`` is a pickled service endpoint (``svc.echo``)."""
        return await ep.route(x)


class StartsOnce(Actor):
    """``setup`` fails while ``marker`` exists; the first replica to start creates it, so
    the second replica of a two-replica service fails (and restarts keep failing)."""

    def __init__(self, marker: str, claim: bool):
        self.marker = marker
        self.claim = claim

    @endpoint
    async def setup(self) -> None:
        if self.claim:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                raise RuntimeError(f"marker {self.marker} exists: refusing to start") from None
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        elif os.path.exists(self.marker):
            raise RuntimeError(f"marker {self.marker} exists: refusing to start")

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class HighestIndexRouter(Router):
    """Always the healthy replica with the highest index (pickled into actors with the
    service's config, so a ``ServiceRef`` uses it too)."""

    def choose(self, replicas, sess_id):
        return max(replicas, key=lambda r: r.index)


class Batcher(Actor):
    """Asks for ``rows`` requests in flight per replica (``service_defaults``), as a replica
    that batches requests itself does; ``hold`` counts the calls it holds at once."""

    def __init__(self, rows: int = 10):
        self.active = self.peak = 0

    @classmethod
    def service_defaults(cls, rows: int = 10, *args, **kwargs) -> dict:
        return {"replica_max_concurrent_requests": rows}

    @endpoint
    async def hold(self, seconds: float) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.active -= 1

    @endpoint
    async def peak_in_flight(self) -> int:
        return self.peak
