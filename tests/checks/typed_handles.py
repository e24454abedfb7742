"""What a type checker sees of actor handles: pyright checks this file (never run) through
tests/checks/test_pyright.py.

A line ending in ``# pyright: ignore[rule]`` must be an error, and ``assert_type`` states a
type: with ``reportUnnecessaryTypeIgnoreComment`` on (pyproject.toml), pyright fails if a
wrong call stops being an error, or if a type changes.
"""

from __future__ import annotations

from typing_extensions import assert_type

from controller import Actor, Future, ValueMesh, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def label(self, prefix: str) -> str:  # a plain ``def`` endpoint
        return f"{prefix}{self.n}"

    @endpoint
    async def twice(self) -> int:
        await self.incr(1)  # inside the actor: the method itself
        return await self.incr(1)


async def actor_mesh() -> None:
    mesh = await Counter.options(procs=2).as_actor(10)
    assert_type(mesh, Counter)
    assert_type(mesh.incr.call(5), Future[ValueMesh[int]])
    assert_type((await mesh.incr.call(by=5)).item(procs=0), int)
    assert_type(await mesh.slice(procs=0).incr.call_one(), int)
    assert_type(await mesh.label.choose("n="), str)
    assert_type(await mesh.with_default_timeout(5.0).incr.with_timeout(1.0).call_one(), int)
    mesh.incr.broadcast(2)
    async for value in mesh.incr.stream():
        assert_type(value, int)
    assert_type(mesh.pids, list[int])
    await mesh.shutdown()

    mesh.incr.call("five")  # pyright: ignore[reportArgumentType]
    mesh.incr.call_one(by=1, step=2)  # pyright: ignore[reportCallIssue]
    mesh.label.choose()  # pyright: ignore[reportCallIssue]
    mesh.decr.call()  # pyright: ignore[reportAttributeAccessIssue]


async def service() -> None:
    svc = await Counter.options(num_replicas=2).as_service(0)
    assert_type(svc, Counter)
    assert_type(await svc.incr.route(3), int)
    assert_type(await svc.incr.route(3, sess_id="a"), int)
    assert_type(await svc.label.fanout("n="), list[str])
    assert_type(await svc.incr.fanout_by_replica(), dict[int, int])
    async with svc.session() as sid:
        assert_type(sid, str)
    await svc.scale(3)
    await svc.shutdown()

    svc.incr.route("three")  # pyright: ignore[reportArgumentType]
    svc.label.fanout(1)  # pyright: ignore[reportArgumentType]


async def proc_mesh() -> None:
    procs = await this_host().spawn_procs(per_host={"procs": 2})
    mesh = procs.spawn("counter", Counter, 10)  # typed like ``as_actor``
    assert_type(mesh, Counter)
    assert_type(await mesh, Counter)
    assert_type(await mesh.incr.call_one(by=2), int)
    assert_type((await mesh.label.call("n=")).item(procs=0), str)
    await procs.stop()

    mesh.incr.call_one("two")  # pyright: ignore[reportArgumentType]
    mesh.decr.call()  # pyright: ignore[reportAttributeAccessIssue]
