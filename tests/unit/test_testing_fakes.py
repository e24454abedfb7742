"""``controller.testing.FakeActorMesh``: a user's actor instances called in-process with the
real adverbs and errors (no process is started)."""

from __future__ import annotations

import asyncio
import re
import textwrap
import threading
import time

import pytest

from controller import Actor, ActorDiedError, ActorError, CallTimeoutError, endpoint
from controller.mesh import MeshFailure
from controller.testing import FakeActorMesh


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.n = start
        self.failures: list[MeshFailure] = []

    @endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    async def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @endpoint
    async def wait_for(self, timeout: float) -> float:
        """Declares ``timeout`` itself: the adverb passes it through."""
        return timeout

    @endpoint
    async def append(self, items: list) -> list:
        items.append(self.n)
        return items

    @endpoint
    def sync_work(self, seconds: float) -> str:
        time.sleep(seconds)
        return threading.current_thread().name

    @endpoint
    async def broadcast_to(self, other) -> None:
        other.fail.broadcast("from a broadcast")

    @endpoint
    async def same(self, other) -> bool:
        return other is SHARED[0]

    def plain(self) -> None:
        """Not an endpoint."""

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True


SHARED: list = []


async def test_every_adverb_reaches_the_instances():
    a, b = Counter(0), Counter(10)
    mesh = FakeActorMesh([a, b])
    assert len(mesh) == 2 and mesh.sizes == {"procs": 2}
    assert (await mesh.incr.call(1)).values() == [1, 11]
    assert await mesh.slice(procs=1).incr.call_one(5) == 16
    assert await mesh.incr.choose(0) in (1, 16)
    assert sorted([v async for v in mesh.incr.stream(1)]) == [2, 17]
    mesh.incr.broadcast(100)
    await asyncio.sleep(0.05)
    assert (a.n, b.n) == (102, 117)
    assert mesh.slice(procs=0).instances == [a]


async def test_misuse_errors_are_the_real_ones():
    mesh = FakeActorMesh([Counter(), Counter()])
    with pytest.raises(ValueError, match=re.escape("mesh.slice(procs=0)")):
        mesh.incr.call_one()
    with pytest.raises(TypeError, match="is remote: call it with an adverb"):
        mesh.incr(1)
    with pytest.raises(AttributeError, match="no endpoint 'nope'; its endpoints are"):
        _ = mesh.nope
    with pytest.raises(AttributeError, match="plain is not an endpoint"):
        _ = mesh.plain
    with pytest.raises(TypeError, match="cannot send the arguments of Counter.append"):
        mesh.append.call(threading.Lock())
    with pytest.raises(TypeError, match="instances of Actor subclasses"):
        FakeActorMesh([object()])
    with pytest.raises(ValueError, match="at least one actor instance"):
        FakeActorMesh([])


async def test_a_raising_endpoint_gives_actor_error_with_the_remote_traceback():
    mesh = FakeActorMesh(Counter())
    with pytest.raises(ActorError) as info:
        await mesh.fail.call_one("boom")
    err = info.value
    assert (err.actor, err.endpoint, err.rank) == ("Counter", "fail", 0)
    assert err.remote_type == "builtins.ValueError" and err.remote_message == "boom"
    assert "raise ValueError(msg)" in err.remote_traceback
    assert isinstance(err.exception, ValueError)
    assert await mesh.incr.call_one() == 1  # the actor keeps serving


async def test_arguments_and_results_are_copied_as_between_processes():
    mesh = FakeActorMesh(Counter(7))
    mine: list = []
    assert await mesh.append.call_one(mine) == [7]
    assert mine == []


async def test_timeouts_and_sync_endpoints():
    mesh = FakeActorMesh(Counter())
    with pytest.raises(CallTimeoutError, match=r"Counter.sleep on rank 0 .* within 0.05 s"):
        await mesh.sleep.call_one(5.0, timeout=0.05)
    assert await mesh.wait_for.call_one(timeout=3.0) == 3.0
    assert await mesh.sleep.with_timeout(1.0).call_one(0.01) == 0.01
    t0 = time.monotonic()
    names = await asyncio.gather(*(mesh.sync_work.call_one(0.1) for _ in range(3)))
    assert time.monotonic() - t0 >= 0.29  # one at a time, off the caller's loop
    assert len(set(names)) == 1 and names[0] != threading.current_thread().name


def test_get_works_from_plain_code():
    mesh = FakeActorMesh(Counter(1))
    assert mesh.incr.call_one(2).get(timeout=5) == 3


async def test_broadcast_failures_reach_the_calling_actors_supervise():
    caller, target = FakeActorMesh(Counter()), FakeActorMesh(Counter())
    await caller.broadcast_to.call_one(target)
    await asyncio.sleep(0.05)
    (failure,) = caller.instances[0].failures
    assert "broadcast Counter.fail failed" in failure.message
    assert isinstance(failure.error, ActorError)


async def test_a_fake_passed_to_a_fake_stays_the_same_object():
    other = FakeActorMesh(Counter())
    SHARED[:] = [other]
    assert await FakeActorMesh(Counter()).same.call_one(other)


async def test_fail_next_kill_and_revive():
    mesh = FakeActorMesh([Counter(), Counter()])
    mesh.fail_next(1)
    with pytest.raises(ActorDiedError, match=r"mesh 'Counter' rank 0 .*SIGKILL.*fail_next"):
        await mesh.slice(procs=0).incr.call_one()
    assert await mesh.slice(procs=0).incr.call_one() == 1

    running = mesh.sleep.call(30.0).start()
    await asyncio.sleep(0.05)
    mesh.kill("chaos monkey")
    with pytest.raises(ActorDiedError, match="chaos monkey"):
        await asyncio.wait_for(running, 5)
    with pytest.raises(ActorDiedError):
        await mesh.incr.call()
    mesh.revive()
    assert (await mesh.incr.call()).values() == [2, 1]
    await mesh.shutdown()
    with pytest.raises(ActorDiedError, match="shut down"):
        await mesh.incr.call()


def test_the_module_docstring_example_runs(tmp_path):
    import controller.testing

    doc = controller.testing.__doc__
    code = doc.split("::\n\n", 1)[1].split("\nHow a fake departs", 1)[0]
    namespace: dict = {"__name__": "fake_example"}
    exec(compile(textwrap.dedent(code), "controller/testing.py docstring", "exec"), namespace)
