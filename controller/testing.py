"""In-process fakes of actor meshes and services, for testing code that calls them.

A fake is built from instances of your own ``Actor`` subclass, in this process: no process
is spawned. It is called exactly like the real thing, because it *is* the real thing from the
call site down to the wire: ``FakeActorMesh`` is an ``ActorMesh`` whose transport runs the
endpoint in-process, so the adverbs (``call_one``, ``call``, ``choose``, ``broadcast``,
``stream``) and their errors are the runtime's own; ``FakeService`` routes through the
runtime's routing core (``controller/_routing.py``), so the router you configure, sticky
sessions, the concurrency cap, failover of a request whose replica dies, ``fanout`` and
``ServiceUnavailable`` behave as in a real service. Arguments and results are pickled on
the way, as between processes (an unpicklable argument fails at the call site, and an actor
never shares your objects). Errors are the runtime's: an endpoint that raises gives an
``ActorError`` carrying the traceback text; a replica made to fail gives ``ActorDiedError``::

    import asyncio
    from controller import Actor, ActorError, endpoint
    from controller.testing import FakeActorMesh, FakeService

    class Doubler(Actor):
        def __init__(self, tag: str = "a"):
            self.tag = tag

        @endpoint
        async def double(self, x: int) -> int:
            if x < 0:
                raise ValueError("negative")
            return 2 * x

        @endpoint
        async def whoami(self) -> str:
            return self.tag

    async def main():
        mesh = FakeActorMesh([Doubler(), Doubler()])            # two ranks
        assert (await mesh.double.call(3)).values() == [6, 6]
        try:
            await mesh.slice(procs=0).double.call_one(-1)
        except ActorError as e:
            assert "ValueError: negative" in e.remote_traceback

        svc = FakeService([Doubler("a"), Doubler("b")], max_retries=1)
        assert [await svc.whoami.route() for _ in range(2)] == ["a", "b"]  # round robin
        svc.replicas[0].fail_next()             # the next request it gets dies with it ...
        assert await svc.whoami.route() == "b"  # ... and is re-sent to replica 1
        assert svc.request_counts()["retried"] == 1
        svc.replicas[1].kill()                  # down until .restart()
        assert await svc.whoami.fanout() == ["a"]
        await svc.shutdown()

    asyncio.run(main())

How a fake departs from the real runtime: the instances you pass are used as they are
(``setup()`` is not run for you, and a restarted fake replica keeps its instance, so
``on_recover`` is not called); ``current_rank()`` inside an endpoint is the test process's;
there are no health checks, restarts in the background or ``scale``. A fake can be passed as
an endpoint argument to another fake (it stays the same object), but not to a real actor
process. Faults are injected with ``FakeActorMesh.fail_next`` / ``kill`` / ``revive`` and
``FakeReplica.fail_next`` / ``kill`` / ``restart`` (a killed rank's calls in flight fail with
``ActorDiedError`` too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import itertools
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from typing import Any

from controller import _context
from controller import _serialization as ser
from controller._actor_mesh import ActorMesh, ProcInfo
from controller._routing import Routing
from controller._service_types import HEALTHY, STOPPED, Replica, ServiceConfig
from controller.actor import Actor
from controller.errors import ActorDiedError, ActorError, CallTimeoutError
from controller.future import Future
from controller.options import ActorOptions
from controller.shape import Shape

__all__ = ["FakeActorMesh", "FakeReplica", "FakeService"]

# Fakes passed as endpoint arguments pickle to a key into this table (weak: it empties itself).
_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def _register(obj) -> int:
    key = next(_KEYS)
    _LIVE[key] = obj
    return key


def _find_fake(key: int):
    obj = _LIVE.get(key)
    if obj is None:
        raise RuntimeError(
            "a controller.testing fake was unpickled outside the process (or after the test) "
            "that made it; fakes run in-process: pass them only to other fakes"
        )
    return obj


def _actor_class(instances: Sequence[Any], what: str) -> type:
    if not instances:
        raise ValueError(f"{what} needs at least one actor instance")
    bad = [i for i in instances if not isinstance(i, Actor)]
    if bad:
        hint = ""
        if isinstance(bad[0], type) and issubclass(bad[0], Actor):
            hint = f"; construct it first, e.g. {what}([{bad[0].__name__}(...)])"
        raise TypeError(f"{what} takes instances of Actor subclasses, got {bad[0]!r}{hint}")
    classes = {getattr(type(i), "_forge_base", type(i)) for i in instances}
    if len(classes) != 1:
        raise TypeError(
            f"{what} needs instances of one actor class, got {sorted(map(str, classes))}"
        )
    return classes.pop()


class _Ranks:
    """The instances behind a fake mesh and its slices: one per rank, with the rank's
    single worker thread (for ``def`` endpoints), its calls in flight and its faults."""

    def __init__(self, instances: list[Any], name: str):
        self.instances = instances
        self.name = name
        self.in_flight = [0] * len(instances)
        self.threads: list[concurrent.futures.ThreadPoolExecutor | None] = [None] * len(instances)
        self.fail_next = 0
        self.dead: str | None = None  # why every call fails, until revived
        self.running: dict[asyncio.Task, asyncio.AbstractEventLoop] = {}
        self.killed: set[asyncio.Task] = set()
        self.lock = threading.Lock()

    def died(self, rank: int, detail: str) -> ActorDiedError:
        return ActorDiedError(self.name, rank, os.getpid(), -signal.SIGKILL, detail)

    def kill(self, reason: str) -> None:
        with self.lock:
            self.dead = reason
            running = list(self.running.items())
            self.killed |= {t for t, _ in running}
        for task, loop in running:
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

    def thread(self, rank: int) -> concurrent.futures.ThreadPoolExecutor:
        with self.lock:
            pool = self.threads[rank]
            if pool is None:
                pool = self.threads[rank] = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"fake-{self.name}-{rank}"
                )
            return pool

    async def invoke(self, rank: int, display: str, ep: str, args, kwargs) -> Any:
        """Run endpoint ``ep`` on rank ``rank`` as the worker would; ``ActorError`` if it
        raises. Runs in its own task, so ``current_actor`` is set for that task only."""
        inst = self.instances[rank]
        _context.current_actor.set(inst)
        prop = getattr(type(inst), ep)
        try:
            if prop.is_async:
                value = await prop.fn(inst, *args, **kwargs)
            else:
                call = functools.partial(prop.fn, inst, *args, **kwargs)
                ctx = contextvars.copy_context()
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self.thread(rank), ctx.run, call)
            try:
                return ser.loads(ser.dumps(value, use_shm=False)[0])
            except Exception as e:  # noqa: BLE001 - reported like the worker reports it
                raise TypeError(f"the endpoint's return value could not be pickled: {e}") from e
        except Exception as e:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            rtype = f"{type(e).__module__}.{type(e).__qualname__}"
            raise ActorError(display, ep, rank, rtype, str(e), tb, e) from None


class FakeActorMesh(ActorMesh):
    """An actor mesh whose ranks are the given actor instances, run in this process.

    ``FakeActorMesh([a0, a1])`` has two ranks (dimension ``procs``); a single instance makes
    a one-rank mesh. Call it as an ``ActorMesh`` (``await mesh.ep.call_one(x)``, ``.call``,
    ``.choose``, ``.broadcast``, ``.stream``, ``mesh.slice(procs=1)``). ``async`` endpoints
    run as tasks on the caller's loop; ``def`` endpoints one at a time in a thread per rank.
    An endpoint named like a method of the fake (``kill``, ``instances``, ...) is reached as
    ``mesh.endpoint(name)``.
    """

    def __init__(self, instances: Any | Sequence[Any], name: str | None = None):
        insts = list(instances) if isinstance(instances, (list, tuple)) else [instances]
        cls = _actor_class(insts, "FakeActorMesh")
        name = name or cls.__name__
        infos = [ProcInfo(f"fake:{name}/{r}", os.getpid()) for r in range(len(insts))]
        super().__init__(name, name, cls, infos, Shape.full({"procs": len(insts)}), name)
        self._ranks = _Ranks(insts, name)
        self._key = _register(self)

    def __reduce__(self) -> Any:
        return (_find_fake, (self._key,))

    def __repr__(self) -> str:
        return f"<FakeActorMesh {self._display} ({self._cls.__name__}) {self._shape}>"

    @property
    def instances(self) -> list[Any]:
        """The actor instance of every rank of this mesh (or slice), in rank order."""
        return [self._ranks.instances[r] for r in self._shape.ranks]

    def _init_slice(self, sub: Any) -> None:  # a FakeActorMesh
        super()._init_slice(sub)
        sub._ranks = self._ranks
        sub._key = _register(sub)

    # -- faults ----------------------------------------------------------------------------
    def fail_next(self, n: int = 1) -> None:
        """The next ``n`` requests to this mesh (one per rank called) fail with
        ``ActorDiedError``, as if the rank's process died on receiving them; the endpoint
        does not run. Later requests work again."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"fail_next(n) needs an int >= 0, got {n!r}")
        with self._ranks.lock:
            self._ranks.fail_next = n

    def kill(self, reason: str = "killed by controller.testing") -> None:
        """Every rank's process dies now: calls in flight and every later call fail with
        ``ActorDiedError`` until ``revive()``."""
        self._ranks.kill(reason)

    def revive(self) -> None:
        """Undo ``kill()`` and ``fail_next()``: calls reach the instances again."""
        with self._ranks.lock:
            self._ranks.dead, self._ranks.fail_next = None, 0

    # -- the transport -----------------------------------------------------------------
    async def _request(self, rank: int, kind: int, body: bytes, ep: str, timeout):
        ranks = self._ranks
        _, ep, args, kwargs = ser.loads(body)
        with ranks.lock:
            if ranks.dead is None and ranks.fail_next:
                ranks.fail_next -= 1
                raise ranks.died(rank, "made to fail by fail_next() (controller.testing)")
            if ranks.dead is not None:
                raise ranks.died(rank, ranks.dead)
            task = asyncio.ensure_future(ranks.invoke(rank, self._display, ep, args, kwargs))
            ranks.running[task] = asyncio.get_running_loop()
            ranks.in_flight[rank] += 1
        try:
            if timeout is None:
                return await task
            try:
                return await asyncio.wait_for(task, timeout)
            except asyncio.TimeoutError:
                raise CallTimeoutError(
                    f"{self._display}.{ep} on rank {rank} (pid {os.getpid()}) did not answer "
                    f"within {timeout} s"
                ) from None
        except asyncio.CancelledError:
            if task in ranks.killed:
                raise ranks.died(rank, ranks.dead or "killed") from None
            raise
        finally:
            with ranks.lock:
                ranks.running.pop(task, None)
                ranks.killed.discard(task)
                ranks.in_flight[rank] -= 1

    def _pick_rank(self) -> int:
        ranks = self._shape.ranks
        start = next(self._rr)
        order = [ranks[(start + i) % len(ranks)] for i in range(len(ranks))]
        return min(order, key=lambda r: self._ranks.in_flight[r])

    def shutdown(self) -> Future[None]:
        """Stop the fake: later calls fail with ``ActorDiedError``; its threads end."""

        async def run():
            self._ranks.kill("the fake actor mesh was shut down")
            for pool in self._ranks.threads:
                if pool is not None:
                    pool.shutdown(wait=False)

        return Future(run, f"shutdown {self._display}")


class FakeReplica(Replica):
    """One replica of a ``FakeService``: ``mesh`` is its ``FakeActorMesh``. Make it fail with
    ``fail_next(n)`` (transient) or ``kill()`` (until ``restart()``)."""

    def __init__(self, svc: FakeService, index: int, mesh: FakeActorMesh):
        super().__init__(index, svc.config.replica_max_concurrent_requests)
        self._svc = svc
        self.mesh: FakeActorMesh = mesh  # pyright: ignore[reportIncompatibleVariableOverride]  # never None
        self.state = HEALTHY
        self.gen = 1
        self.down = False  # killed: stays out of rotation until restart()

    @property
    def instances(self) -> list[Any]:
        """The actor instance of every rank of this replica."""
        return self.mesh.instances

    def fail_next(self, n: int = 1) -> None:
        """Its next ``n`` requests die with it (``ActorDiedError``): each is re-sent to
        another replica as the service's failover says, and the replica is back at once
        (as if restarted instantly; ``restarts`` counts it)."""
        self.mesh.fail_next(n)

    def kill(self, reason: str = "killed by controller.testing") -> None:
        """Its processes die now: it leaves rotation (its sessions move), requests in flight
        on it fail over, and it stays down until ``restart()``."""
        self.down = True
        self.mesh.kill(reason)
        self._svc._replica_died(self, self.gen, reason)

    def restart(self) -> None:
        """Bring a killed replica back (same instances; ``on_recover`` is not called)."""
        with self._svc._lock:
            if self._svc._stopped:
                raise RuntimeError(f"{self._svc!r} is shut down")
            self.down = False
            self.mesh.revive()
            self._svc._back(self)


class FakeService(Routing):
    """A service whose replicas are the given actor instances, run in this process.

    ``FakeService([a, b, c], router="least_loaded", max_retries=1)``: one replica per
    instance (a list of instances makes a replica of several ranks). Service options
    (``router``, ``max_retries``, ``unavailable_timeout``, ``health_poll_rate``,
    ``replica_max_concurrent_requests``) are checked as ``as_service`` checks them. Call it
    as a ``Service``: ``await svc.ep.route(x)``, ``.fanout``, ``.fanout_by_replica``,
    sessions, ``metrics()``, ``request_counts()``, ``shutdown()``; ``svc.replicas[i]`` is a
    ``FakeReplica`` to inject failures with.
    """

    def __init__(self, replicas: Sequence[Any], name: str | None = None, **options: Any):
        groups = [list(g) if isinstance(g, (list, tuple)) else [g] for g in replicas]
        cls = _actor_class([i for g in groups for i in g], "FakeService")
        ignored = sorted(k for k in options if k.startswith("health_check"))
        if ignored:
            raise ValueError(
                f"FakeService has no health checks, so {ignored} would do nothing; make a "
                "replica fail with svc.replicas[i].fail_next() or .kill() instead"
            )
        opts = ActorOptions(num_replicas=len(groups), mesh_name=name, extra=dict(options))
        config = ServiceConfig.from_options(opts)
        self._init_routing(name or cls.__name__, cls, config)
        self.replicas = [
            FakeReplica(self, i, FakeActorMesh(g, name=f"{self.name}-r{i}"))
            for i, g in enumerate(groups)
        ]
        self._key = _register(self)

    def __reduce__(self):
        return (_find_fake, (self._key,))

    def __repr__(self) -> str:
        return f"<FakeService {self.name} replicas={[r.state for r in self.replicas]}>"

    def _replica_died(self, r: Replica, gen: int, reason: str) -> None:
        with self._lock:
            if not self._mark_down(r, gen, reason):
                return
            if not getattr(r, "down", False) and not self._stopped:
                self._back(r)  # fail_next(): back at once, as after an instant restart

    def _back(self, r: Replica) -> None:
        with self._lock:
            if r.state == HEALTHY:
                return
            r.gen += 1
            r.restarts += 1
            r.state = HEALTHY
            if r.down_since is not None:
                r.last_recovery_s = time.monotonic() - r.down_since
                r.down_since = None

    def metrics(self) -> dict[int, dict[str, Any]]:
        """Per replica index, the same fields as ``Service.metrics()``."""
        return {r.index: r.metrics() for r in self.replicas}

    def shutdown(self) -> Future[None]:
        """Stop every replica; later calls raise ``ServiceUnavailable``."""

        async def run():
            with self._lock:
                self._stopped = True
                for r in self.replicas:
                    r.wanted, r.state = False, STOPPED
            for r in self.replicas:
                await r.mesh.shutdown()  # pyright: ignore[reportOptionalMemberAccess]  # fakes: set

        return Future(run, f"{self.name}.shutdown")
