"""Actors used by the runtime tests (importable, so they pickle by reference)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

from controller import Actor, current_rank, current_size, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.n = start
        self.log: list[int] = []

    @endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        self.log.append(by)
        return self.n

    @endpoint
    async def value(self) -> int:
        return self.n

    @endpoint
    async def history(self) -> list[int]:
        return list(self.log)

    @endpoint
    def where(self) -> dict:
        return {
            "rank": current_rank().rank,
            "size": current_size(),
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "env_rank": os.environ.get("RANK"),
            "world": os.environ.get("WORLD_SIZE"),
        }

    @endpoint
    def getenv(self, variable: str) -> str | None:
        return os.environ.get(variable)

    @endpoint
    async def sleep(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return current_rank().rank

    @endpoint
    def block(self, seconds: float) -> int:
        time.sleep(seconds)
        return current_rank().rank

    @endpoint
    async def fail(self, msg: str) -> None:
        raise KeyError(msg)

    @endpoint
    async def die(self, code: int = 3) -> None:
        os._exit(code)

    @endpoint
    async def echo(self, x):
        return x

    @endpoint
    async def apply(self, fn, *args):
        return fn(*args)

    @endpoint
    async def shared_wait(self, seconds: float) -> int:
        """Every call awaits one future, created by the first: concurrent callers share it."""
        if getattr(self, "_shared", None) is None or self._shared.done():
            self._shared = asyncio.ensure_future(asyncio.sleep(seconds, result=self.n))
        return await self._shared

    @endpoint
    async def loop_type(self) -> str:
        loop = asyncio.get_running_loop()
        return f"{type(loop).__module__}.{type(loop).__name__}"

    @endpoint
    async def wait_for(self, timeout: float) -> float:
        """Declares ``timeout`` itself, so the adverb passes it through."""
        return timeout

    @endpoint
    async def bounded_wait(self, seconds: float) -> str:
        """Enters asyncio's timeouts before its first await (the replay buffer's pattern):
        on Python 3.12 that needs the call to run inside a Task from its first step."""
        try:
            await asyncio.wait_for(asyncio.Event().wait(), seconds)
        except asyncio.TimeoutError:
            pass
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(seconds):
                await asyncio.sleep(0)
        return "bounded"

    def not_an_endpoint(self) -> int:
        return 1


class Caller(Actor):
    """Calls another mesh from inside an actor process."""

    def __init__(self):
        self.failures: list = []
        self.child = None

    @endpoint
    async def call_other(self, mesh, by: int) -> list[int]:
        return (await mesh.incr.call(by)).values()

    @endpoint
    def call_other_sync(self, mesh) -> int:
        return mesh.slice(procs=0).value.call_one().get(timeout=10)

    @endpoint
    async def spawn_child(self) -> list[int]:
        pm = await this_host().spawn_procs(per_host={"procs": 1}, name="child")
        self.child = pm.spawn("child", Counter)
        await self.child
        return pm.pids

    @endpoint
    async def kill_child(self) -> None:
        self.child.die.broadcast()

    @endpoint
    async def failures_seen(self) -> list[str]:
        return [f.message for f in self.failures]

    def __supervise__(self, failure) -> bool:
        self.failures.append(failure)
        return True


class Tensors(Actor):
    @endpoint
    async def roundtrip(self, t):
        return t

    @endpoint
    async def add_one(self, t):
        t += 1
        return t

    @endpoint
    async def checksum(self, t) -> float:
        return float(t.double().sum())


class SetupFails(Actor):
    @endpoint
    async def setup(self) -> None:
        raise RuntimeError("weights not found at /nowhere")


class InitFails(Actor):
    def __init__(self):
        raise ValueError("bad constructor argument")


class WithSetup(Actor):
    def __init__(self):
        self.ready = False

    @endpoint
    async def setup(self) -> None:
        self.ready = True

    @endpoint
    async def is_ready(self) -> bool:
        return self.ready


class WithTeardown(Actor):
    def __init__(self, path: str):
        self.path = path

    @endpoint
    async def ping(self) -> int:
        return 1

    async def teardown(self) -> None:
        with open(self.path, "w") as f:
            f.write("bye")
