"""Services: N replicas of an actor behind one handle (see docs/services.md).

``svc = await Cls.options(num_replicas=3, procs=1).as_service(*init_args)`` starts every
replica (each its own proc mesh) in parallel. ``await svc.ep.route(x)`` sends one request to
one healthy replica (round robin unless the router says otherwise; sticky within a session);
``await svc.ep.fanout(x)`` sends it to every healthy replica. A replica whose process dies,
or whose event loop stops answering health-check pings, is marked unhealthy at once, its
requests are retried elsewhere, its sessions re-homed, and it is restarted in the background
on the runtime's loop (its ``on_recover`` endpoint runs before it takes traffic again).

A ``Service`` is picklable: an actor that receives one gets a ``ServiceRef``
(controller/_service_ref.py) that routes and fans out itself, reading the replica table this
service keeps in the session directory (see ``_publish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import pickle
import threading
import time
import uuid
from typing import Any

from controller import _wire
from controller._runtime import get_runtime
from controller._service_types import (
    DRAINING,
    HEALTHY,
    MAX_RESTART_DELAY_S,
    RECOVERING,
    STOPPED,
    UNHEALTHY,
    Replica,
    ServiceConfig,
    ServiceEndpoint,
    Stale,
)
from controller.actor import spawn_actor
from controller.endpoint import EndpointProperty, Future
from controller.errors import ActorDiedError, ServiceUnavailable
from controller.mesh import ActorMesh
from controller.router import LeastLoadedRouter, build_router

logger = logging.getLogger("controller")
REQUEST_COUNTS = ("sent", "retried", "completed", "failed", "cancelled")


class Service:
    """A handle to the replicas of one actor; endpoints are attributes (``svc.<endpoint>``).
    Made by ``Cls.options(num_replicas=N, ...).as_service(*args)``."""

    def __init__(self, cls: type, opts, config: ServiceConfig, args, kwargs):
        self.name = opts.mesh_name or cls.__name__
        self.config = config
        self.replicas: list[Replica] = []
        self._cls, self._opts, self._args, self._kwargs = cls, opts, args, kwargs
        self._router = build_router(config.router)
        self._session_router = LeastLoadedRouter()
        self._sessions: dict[str, Replica | None] = {}
        self._session_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            f"forge_session_{self.name}", default=None
        )
        self._lock = threading.RLock()
        self._next_index = 0
        self._stopped = False
        self._restarts: dict[int, Any] = {}
        self._requests = dict.fromkeys(REQUEST_COUNTS, 0)
        self._checker: Any = None  # the health-check task (a concurrent future)
        self._on_recover_s: dict[int, float] = {}  # replica index -> its last on_recover time
        self._table_path: str | None = None  # set once pickled: remote handles read it
        self._endpoints: dict[str, ServiceEndpoint] = {}  # made once per name (hot path)

    def __reduce__(self):
        from controller._service_ref import ServiceRef

        with self._lock:
            if self._table_path is None:
                self._table_path = os.path.join(
                    get_runtime().session.dir, f"service-{self.name}-{uuid.uuid4().hex[:8]}.pkl"
                )
            self._publish()
        return (ServiceRef, (self.name, self._cls, self._table_path, self.config))

    def __repr__(self) -> str:
        return f"<Service {self.name} replicas={[r.state for r in self.replicas]}>"

    def __getattr__(self, name: str) -> ServiceEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.endpoint(name)

    def endpoint(self, name: str) -> ServiceEndpoint:
        """The endpoint called ``name`` (also ``svc.<name>``, unless a method shadows it)."""
        ep = self._endpoints.get(name)
        if ep is not None:
            return ep
        attr = getattr(self._cls, name, None)
        if isinstance(attr, EndpointProperty):
            ep = self._endpoints[name] = ServiceEndpoint(self, attr)
            return ep
        raise AttributeError(f"{self._cls.__name__} has no endpoint {name!r}")

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
            self._attach(r, mesh)
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
        pm = mesh._proc_mesh
        pm._owner = self  # deaths are ours to handle: no "UNHANDLED FAILURE" noise
        pm.add_death_callback(lambda f: self._mark_dead(r, gen, f.message))

    def _mark_dead(self, r: Replica, gen: int, reason: str) -> None:
        """Take ``r`` out of rotation, re-home its sessions, restart it (any thread)."""
        with self._lock:
            if r.gen != gen or r.state != HEALTHY:
                return
            r.state = UNHEALTHY
            r.last_error = reason
            r.down_since = time.monotonic()
            self._rehome(r)
            self._publish()
            if self._stopped or not r.wanted:
                return
            logger.warning(
                "service %s: replica %d is down (%s); restarting", self.name, r.index, reason
            )
            loop = get_runtime().background_loop()
            self._restarts[r.index] = asyncio.run_coroutine_threadsafe(self._restart(r), loop)

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
                    self._mark_dead(
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
            for cf in restarts:
                cf.cancel()
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
        table = {
            "stopped": self._stopped,
            "replicas": [
                (r.index, r.gen, r.state, r.mesh)
                for r in self.replicas
                if r.state == HEALTHY and r.mesh is not None
            ],
            "states": {r.index: r.state for r in self.replicas},
        }
        tmp = f"{self._table_path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                pickle.dump(table, f)
            os.replace(tmp, self._table_path)
        except OSError as e:  # the session dir is gone (shutting down): nobody reads it
            logger.debug("service %s: cannot write its replica table: %s", self.name, e)

    def request_counts(self) -> dict[str, int]:
        """``route`` requests since the service started: ``sent``, ``retried`` (re-sent after
        their replica died), ``completed``, ``failed`` (an error reached the caller) and
        ``cancelled`` (the caller gave up); the rest of ``sent`` is in flight."""
        with self._lock:
            return dict(self._requests)

    def _count(self, key: str) -> None:
        with self._lock:
            self._requests[key] += 1

    # -- sessions --------------------------------------------------------------------------
    def _bind(self, sid: str, r: Replica | None) -> None:
        old = self._sessions.get(sid)
        if old is not None:
            old.sessions -= 1
        self._sessions[sid] = r
        if r is not None:
            r.sessions += 1

    def _rehome(self, r: Replica) -> None:
        """Move ``r``'s sessions to the least-loaded healthy replicas (call with the lock)."""
        healthy = [x for x in self.replicas if x.state == HEALTHY and x is not r]
        for sid, owner in self._sessions.items():
            if owner is r:
                self._bind(sid, self._session_router.choose(healthy, sid) if healthy else None)

    def start_session(self) -> Future[str]:
        """A new session id, placed on the least-loaded healthy replica."""

        async def run():
            sid = uuid.uuid4().hex
            with self._lock:
                healthy = [r for r in self.replicas if r.state == HEALTHY]
                self._bind(sid, self._session_router.choose(healthy, sid) if healthy else None)
            return sid

        return Future(run, f"{self.name}.start_session")

    def terminate_session(self, sid: str) -> Future[None]:
        """Forget session ``sid`` (its next request would start afresh)."""

        async def run():
            with self._lock:
                self._bind(sid, None)
                self._sessions.pop(sid, None)

        return Future(run, f"{self.name}.terminate_session")

    @contextlib.asynccontextmanager
    async def session(self):
        """``async with svc.session():`` routes every call inside to one replica."""
        sid = await self.start_session()
        token = self._session_var.set(sid)
        try:
            yield sid
        finally:
            self._session_var.reset(token)
            await self.terminate_session(sid)

    # -- requests --------------------------------------------------------------------------
    # ``route`` is the hot path: a no-op route should cost little more than a direct
    # ``call_one`` (benchmarks/services.py, ``route_overhead``). So the first attempt picks and
    # sends without waiting machinery, one coroutine carries the whole request (counters,
    # retries), and a one-rank replica is called straight through ``ActorMesh._request``.
    def _pick(self, sid: str | None, tried: set[int] | None) -> Replica | None:
        with self._lock:
            if tried:
                healthy = [r for r in self.replicas if r.state == HEALTHY and r.index not in tried]
            else:
                healthy = [r for r in self.replicas if r.state == HEALTHY]
            if not healthy:
                return None
            if sid is None:
                return self._router.choose(healthy, None)
            owner = self._sessions.get(sid)
            if owner is None or owner not in healthy:
                owner = self._session_router.choose(healthy, sid)
                self._bind(sid, owner)
            return owner

    async def _wait_for(self, pick):
        """``pick()`` until it gives a replica; wait up to ``unavailable_timeout``."""
        deadline = time.monotonic() + self.config.unavailable_timeout
        while True:
            if self._stopped:
                raise ServiceUnavailable(f"service {self.name!r} is shut down")
            got = pick()
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                states = ", ".join(f"{r.index}={r.state}" for r in self.replicas)
                errors = "; ".join(r.last_error for r in self.replicas if r.last_error)
                raise ServiceUnavailable(
                    f"service {self.name!r} has no healthy replica after waiting "
                    f"{self.config.unavailable_timeout} s (replicas: {states or 'none'})"
                    + (f"; last errors: {errors}" if errors else "")
                )
            await asyncio.sleep(min(self.config.health_poll_rate, left))

    async def _call(self, r: Replica, ep: str, args, kwargs) -> Any:
        """Send to ``r`` (waiting for one of its request slots); rank 0's value."""
        gen, mesh = r.gen, r.mesh
        with r.lock:
            r.in_flight += 1
        t0 = None  # set once the request is sent: only a sent request counts as total/failed
        try:
            sem = r.semaphore()
            await sem.acquire()
            try:
                if r.state != HEALTHY or r.gen != gen or mesh is None:
                    raise Stale()
                t0 = time.monotonic()
                if len(mesh._shape) == 1 and "timeout" not in kwargs:
                    # What ``mesh.endpoint(ep).call(...)`` does for one rank, without the
                    # Endpoint, Future and ValueMesh it would build (the endpoint name was
                    # checked when ``svc.<ep>`` was made; ``timeout=`` takes the long way).
                    body = mesh._encode(ep, args, kwargs, 1)[0]
                    ready = mesh._ready
                    if ready is not None and not (ready.done() and ready.exception() is None):
                        await mesh._await_ready()
                    value = await mesh._request(mesh._shape.ranks[0], _wire.CALL, body, ep, None)
                else:
                    value = (await mesh.endpoint(ep).call(*args, **kwargs)).values()[0]
            finally:
                sem.release()
        except BaseException as e:
            sent_and_failed = t0 is not None and isinstance(e, Exception)
            with r.lock:
                r.in_flight -= 1
                if sent_and_failed:
                    r.total += 1
                    r.failed += 1
            if sent_and_failed and isinstance(e, ActorDiedError):
                self._mark_dead(r, gen, str(e))
            raise
        with r.lock:
            r.in_flight -= 1
            r.total += 1
            r.ok += 1
            r.latencies.append(time.monotonic() - t0)
        return value

    async def _route(self, ep: str, args, kwargs, sid: str | None) -> Any:
        """One ``route`` request: a healthy replica (the session's, if any) answers; re-sent
        to another replica if its replica dies, up to ``max_retries`` times; counted in
        ``request_counts``."""
        with self._lock:
            self._requests["sent"] += 1
        tried: set[int] | None = None  # replicas this request died on (made at the first death)
        last: ActorDiedError | None = None

        def pick():
            r = self._pick(sid, tried)
            if r is None and last is not None and all(x.index in tried for x in self.replicas):
                raise last  # every replica has had this request once and died on it
            return r

        try:
            while True:
                r = None if self._stopped else self._pick(sid, tried)
                if r is None:
                    r = await self._wait_for(pick)
                try:
                    value = await self._call(r, ep, args, kwargs)
                    break
                except Stale:
                    continue
                except ActorDiedError as e:
                    last = e
                    tried = tried or set()
                    tried.add(r.index)
                    if len(tried) > self.config.max_retries:
                        raise
                    self._count("retried")
                    logger.info("service %s: re-sending %s after %s", self.name, ep, e)
        except asyncio.CancelledError:
            self._count("cancelled")
            raise
        except BaseException:
            self._count("failed")
            raise
        with self._lock:
            self._requests["completed"] += 1
        return value

    async def _fanout(self, ep: str, args, kwargs) -> dict[int, Any]:
        def pick():
            return [r for r in self.replicas if r.state == HEALTHY]

        targets = await self._wait_for(pick)
        results = await asyncio.gather(
            *(self._call(r, ep, args, kwargs) for r in targets), return_exceptions=True
        )
        out: dict[int, Any] = {}
        for r, res in zip(targets, results):
            if isinstance(res, (ActorDiedError, Stale)):
                continue
            if isinstance(res, BaseException):
                raise res
            out[r.index] = res
        if not out:
            raise ServiceUnavailable(f"service {self.name!r}: every replica died during fanout")
        return out


async def _ping(mesh: ActorMesh) -> None:
    """A PING to every process of ``mesh``, answered by each worker's event loop."""
    await asyncio.gather(
        *(mesh._request(rank, _wire.PING, b"", "health check", None) for rank in mesh._shape.ranks)
    )


async def _stop_mesh(mesh: ActorMesh) -> None:
    try:
        await mesh.shutdown()
    except Exception as e:  # noqa: BLE001 - stopping is best effort; the process may be gone
        logger.debug("stopping %r failed: %s", mesh, e)
