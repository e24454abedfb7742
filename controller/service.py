"""Services: N replicas of an actor behind one handle (see docs/services.md).

``svc = await Cls.options(num_replicas=3, procs=1).as_service(*init_args)`` starts every
replica (each its own proc mesh) in parallel. ``await svc.ep.route(x)`` sends one request to
one healthy replica (round robin unless the router says otherwise; sticky within a session);
``await svc.ep.fanout(x)`` sends it to every healthy replica. A replica whose process dies,
or whose event loop stops answering health-check pings, is marked unhealthy at once, its
requests are retried elsewhere, its sessions re-homed, and it is restarted in the background
on the runtime's loop (its ``on_recover`` endpoint runs before it takes traffic again).

Choosing a replica, sessions, failover and fanout are the routing core's
(controller/_routing.py), shared with the ``ServiceRef`` below and with
``controller.testing.FakeService``; this module starts and supervises the replicas.

A ``Service`` is picklable: an actor that receives one gets a ``ServiceRef``
(controller/_service_ref.py) that routes and fans out itself, reading the replica table this
service keeps in the session directory (see ``_publish``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any, cast

from controller import _wire
from controller._routing import Routing, ServiceEndpoint
from controller._runtime import get_runtime
from controller._service_ref import ServiceRef, write_table
from controller._service_types import (
    DRAINING,
    HEALTHY,
    MAX_RESTART_DELAY_S,
    RECOVERING,
    STOPPED,
    Replica,
    ServiceConfig,
)
from controller._spawn import spawn_actor
from controller.endpoint import EndpointProperty
from controller.errors import ActorDiedError
from controller.future import Future
from controller.mesh import ActorMesh, ProcMesh

__all__ = ["Service", "ServiceConfig", "ServiceEndpoint"]
logger = logging.getLogger("controller")
RESTART_STOP_TIMEOUT_S = 30.0  # shutdown's wait for cancelled restarts to clean up


class Service(Routing):
    """A handle to the replicas of one actor; endpoints are attributes (``svc.<endpoint>``).
    Made by ``Cls.options(num_replicas=N, ...).as_service(*args)``. Routing, sessions,
    failover and fanout are ``Routing``'s (controller/_routing.py); this class supervises:
    it starts, restarts, health-checks, scales and stops the replicas."""

    def __init__(self, cls: type, opts, config: ServiceConfig, args, kwargs):
        self._init_routing(opts.mesh_name or cls.__name__, cls, config)
        self._opts, self._args, self._kwargs = opts, args, kwargs
        self._next_index = 0
        self._restarts: dict[int, _Restart] = {}  # replica index -> its latest restart
        self._checker: Any = None  # the health-check task (a concurrent future)
        self._on_recover_s: dict[int, float] = {}  # replica index -> its last on_recover time
        self._table_path: str | None = None  # set once pickled: remote handles read it

    def __reduce__(self):
        with self._lock:
            if self._table_path is None:
                self._table_path = os.path.join(
                    get_runtime().session.dir, f"service-{self.name}-{uuid.uuid4().hex[:8]}.pkl"
                )
            self._publish()
        return (ServiceRef, (self.name, self._cls, self._table_path, self.config))

    def __repr__(self) -> str:
        return f"<Service {self.name} replicas={[r.state for r in self.replicas]}>"

    def __supervise__(self, failure) -> bool:
        """Replica meshes report deaths here too; the death callback has handled them."""
        return True

    # -- lifetime --------------------------------------------------------------------------
    @classmethod
    async def _start(cls, actor_cls, opts, config: ServiceConfig, args, kwargs) -> Service:
        svc = cls(actor_cls, opts, config, args, kwargs)
        svc.replicas = await svc._add_replicas(config.num_replicas)
        get_runtime().services.append(svc)
        if config.health_check_interval_s > 0 and config.health_check_timeout_s > 0:
            loop = get_runtime().background_loop()
            svc._checker = asyncio.run_coroutine_threadsafe(svc._health_checks(), loop)
        return svc

    async def _add_replicas(self, n: int) -> list[Replica]:
        """Start ``n`` replicas in parallel; if any fails, stop the rest and raise."""
        new = []
        for _ in range(n):
            new.append(Replica(self._next_index, self.config.replica_max_concurrent_requests))
            self._next_index += 1
        results = await asyncio.gather(
            *(self._spawn_mesh(r.index, recover=False) for r in new), return_exceptions=True
        )
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            ok = [m for m in results if isinstance(m, ActorMesh)]
            await asyncio.gather(*(_stop_mesh(m) for m in ok))
            raise errors[0]
        for r, mesh in zip(new, results):
            self._attach(r, mesh)  # pyright: ignore[reportArgumentType]  # no errors: all meshes
        return new

    async def _spawn_mesh(self, index: int, recover: bool) -> ActorMesh:
        name = f"{self.name}-r{index}"
        mesh = await spawn_actor(self._cls, self._opts, self._args, self._kwargs, name=name)
        try:
            if recover and isinstance(getattr(self._cls, "on_recover", None), EndpointProperty):
                t0 = time.monotonic()
                await mesh.endpoint("on_recover").call()
                self._on_recover_s[index] = time.monotonic() - t0
        except BaseException:
            await asyncio.shield(asyncio.ensure_future(_stop_mesh(mesh)))
            raise
        return mesh

    def _attach(self, r: Replica, mesh: ActorMesh) -> None:
        with self._lock:
            r.mesh = mesh
            r.gen += 1
            gen = r.gen
            r.state = HEALTHY
            if r.down_since is not None:
                r.last_recovery_s = time.monotonic() - r.down_since
                r.down_since = None
            self._publish()
        pm = cast(ProcMesh, mesh._proc_mesh)  # as_actor's meshes own their proc mesh
        pm._owner = self  # deaths are ours to handle: no "UNHANDLED FAILURE" noise
        pm.add_death_callback(lambda f: self._replica_died(r, gen, f.message))

    def _replica_died(self, r: Replica, gen: int, reason: str) -> None:
        """Take ``r`` out of rotation, re-home its sessions, restart it (any thread)."""
        with self._lock:
            if not self._mark_down(r, gen, reason):
                return
            self._publish()
            if self._stopped or not r.wanted:
                return
            logger.warning(
                "service %s: replica %d is down (%s); restarting", self.name, r.index, reason
            )
            loop = get_runtime().background_loop()
            self._restarts[r.index] = _Restart(self._restart(r), loop)

    async def _restart(self, r: Replica) -> None:
        """Replace ``r``'s mesh until it works (backing off), unless the service stops."""
        delay = self.config.health_poll_rate
        while r.wanted and not self._stopped:
            r.state = RECOVERING
            if r.mesh is not None:
                await _stop_mesh(r.mesh)
            try:
                mesh = await self._spawn_mesh(r.index, recover=True)
            except Exception as e:  # noqa: BLE001 - recorded, shown in metrics, retried
                r.last_error = f"restart failed: {e}"
                logger.warning("service %s: replica %d %s", self.name, r.index, r.last_error)
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RESTART_DELAY_S)
                continue
            with self._lock:
                keep = r.wanted and not self._stopped
                if keep:
                    r.restarts += 1
                    self._attach(r, mesh)
            if not keep:
                await _stop_mesh(mesh)
            else:
                logger.warning(
                    "service %s: replica %d is back after %.2f s (on_recover: %.2f s)",
                    self.name,
                    r.index,
                    r.last_recovery_s or 0.0,
                    self._on_recover_s.get(r.index, 0.0),
                )
            return

    async def _health_checks(self) -> None:
        """Every ``health_check_interval_s``, ping each process of every healthy replica; a
        replica with a process that stays silent for ``health_check_timeout_s`` is taken out
        of rotation and restarted like a dead one (its in-flight requests fail over when its
        processes are stopped). Runs on the runtime's loop until the service stops."""
        interval = self.config.health_check_interval_s
        timeout = self.config.health_check_timeout_s
        while not self._stopped:
            await asyncio.sleep(interval)
            with self._lock:
                targets = [
                    (r, r.gen, r.mesh)
                    for r in self.replicas
                    if r.state == HEALTHY and r.mesh is not None
                ]
            results = await asyncio.gather(
                *(asyncio.wait_for(_ping(m), timeout) for _, _, m in targets),
                return_exceptions=True,
            )
            for (r, gen, _), res in zip(targets, results):
                if isinstance(res, asyncio.TimeoutError):
                    self._replica_died(
                        r,
                        gen,
                        f"a process did not answer a health check within {timeout} s "
                        "(its event loop is blocked)",
                    )
                elif isinstance(res, Exception) and not isinstance(res, ActorDiedError):
                    logger.debug("service %s: health check of %r: %s", self.name, r, res)

    def shutdown(self) -> Future[None]:
        """Stop every replica and its processes. Later calls raise ``ServiceUnavailable``."""

        async def run():
            with self._lock:
                if self._stopped:
                    return
                self._stopped = True
                for r in self.replicas:
                    r.wanted, r.state = False, STOPPED
                meshes = [r.mesh for r in self.replicas if r.mesh is not None]
                restarts = list(self._restarts.values())
            for restart in restarts:
                restart.cancel()
            # A cancelled restart may be mid-spawn: wait until it has stopped what it started,
            # so that no replica process outlives the service.
            await asyncio.get_running_loop().run_in_executor(
                None, _wait_ended, restarts, RESTART_STOP_TIMEOUT_S
            )
            if self._checker is not None:
                self._checker.cancel()
            with self._lock:
                self._publish()
            services = get_runtime().services
            if self in services:
                services.remove(self)
            await asyncio.gather(*(_stop_mesh(m) for m in meshes))

        return Future(run, f"{self.name}.shutdown")

    def scale(self, n: int) -> Future[None]:
        """Grow to ``n`` replicas, or drain the surplus (unhealthy ones first): drained
        replicas take no new requests, finish those in flight, then stop."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"scale(n) needs a positive int, got {n!r}")

        async def run():
            live = list(self.replicas)
            if n > len(live):
                added = await self._add_replicas(n - len(live))
                self.replicas = self.replicas + added
                return
            victims = sorted(live, key=lambda r: (r.state == HEALTHY, -r.index))[: len(live) - n]
            with self._lock:
                for v in victims:
                    v.wanted, v.state = False, DRAINING
                    self.replicas = [r for r in self.replicas if r is not v]
                    self._rehome(v)
                    restart = self._restarts.pop(v.index, None)
                    if restart is not None:
                        restart.cancel()
            with self._lock:
                self._publish()
            for v in victims:
                while v.in_flight:
                    await asyncio.sleep(self.config.health_poll_rate)
                if v.mesh is not None:
                    await _stop_mesh(v.mesh)
                v.state = STOPPED

        return Future(run, f"{self.name}.scale")

    def metrics(self) -> dict[int, dict[str, Any]]:
        """Per replica index: state, pids, request counts, in flight, latency, sessions,
        restarts, last error and ``last_recovery_s`` (out of rotation -> healthy again)."""
        return {r.index: r.metrics() for r in self.replicas}

    def _publish(self) -> None:
        """Write the replica table that pickled handles (``ServiceRef``) route with: replaced
        atomically on every change once this service has been pickled (call with the lock)."""
        if self._table_path is None:
            return
        rows = [
            (r.index, r.gen, r.state, r.mesh if r.state == HEALTHY else None) for r in self.replicas
        ]
        try:
            write_table(self._table_path, self._stopped, rows)
        except OSError as e:  # the session dir is gone (shutting down): nobody reads it
            logger.debug("service %s: cannot write its replica table: %s", self.name, e)


async def _ping(mesh: ActorMesh) -> None:
    """A PING to every process of ``mesh``, answered by each worker's event loop."""
    await asyncio.gather(
        *(mesh._request(rank, _wire.PING, b"", "health check", None) for rank in mesh._shape.ranks)
    )


class _Restart:
    """A replica's restart, run on the runtime's loop; any thread may cancel it and wait
    until nothing of it runs any more (cancelled mid-spawn, it first stops what it spawned)."""

    def __init__(self, coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._task: asyncio.Task | None = None
        self._cancelled = False
        self.ended = threading.Event()
        loop.call_soon_threadsafe(self._start, coro)

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._cancelled:  # cancelled before it began: nothing to undo
            coro.close()
            self.ended.set()
            return
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a replica restart failed: %r", task.exception())
        self.ended.set()

    def cancel(self) -> None:
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()


def _wait_ended(restarts: list[_Restart], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for restart in restarts:
        if not restart.ended.wait(max(0.0, deadline - time.monotonic())):
            logger.warning("a cancelled replica restart did not end within %.0f s", timeout)
            return


async def _stop_mesh(mesh: ActorMesh) -> None:
    """Stop ``mesh``. A cancel that arrives meanwhile lets the stop finish first (a
    half-stopped mesh would outlive its service), then propagates."""
    task = asyncio.ensure_future(_stop_quietly(mesh))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


async def _stop_quietly(mesh: ActorMesh) -> None:
    try:
        await mesh.shutdown()
    except Exception as e:  # noqa: BLE001 - stopping is best effort; the process may be gone
        logger.debug("stopping %r failed: %s", mesh, e)
