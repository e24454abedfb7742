"""The routing core every service handle shares: the controller's ``Service``, the
``ServiceRef`` a pickled service becomes in another process, and the in-process
``controller.testing.FakeService``.

It decides what happens to one request: wait for a healthy replica (up to
``unavailable_timeout``), choose one (the configured router; sticky within a session), send
it under the replica's concurrency cap, and re-send it elsewhere if its replica dies (at most
``max_retries`` times, never twice to the same replica generation: a restarted replica is a
new place to try, waited for within ``unavailable_timeout``); and ``fanout`` to every healthy
replica. A subclass owns the replica list (``self.replicas``) and says what a death means
(``_replica_died``) and where fresh news of the replicas comes from (``_refresh``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from typing import Any

from controller._service_types import HEALTHY, RECOVERING, UNHEALTHY, Replica, ServiceConfig, Stale
from controller.endpoint import EndpointProperty
from controller.errors import ActorDiedError, ServiceUnavailable
from controller.future import Future
from controller.router import LeastLoadedRouter, build_router

logger = logging.getLogger("controller")
REQUEST_COUNTS = ("sent", "retried", "completed", "failed", "cancelled")


class Routing:
    """Routes requests over ``self.replicas`` (``Replica`` objects whose ``mesh`` answers
    ``_first_value(ep, args, kwargs)``). Subclasses call ``_init_routing`` first."""

    def _init_routing(self, name: str, cls: type, config: ServiceConfig) -> None:
        self.name = name
        self.config = config
        self.replicas: list[Replica] = []
        self._cls = cls
        self._router = build_router(config.router)
        self._session_router = LeastLoadedRouter()
        self._sessions: dict[str, Replica | None] = {}
        self._session_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            f"forge_session_{name}", default=None
        )
        self._lock = threading.RLock()
        self._stopped = False
        self._requests: dict[str, int] = dict.fromkeys(REQUEST_COUNTS, 0)
        self._endpoints: dict[str, ServiceEndpoint] = {}  # made once per name (hot path)

    # -- what a subclass decides ---------------------------------------------------------
    _endpoint_type: type[ServiceEndpoint]

    def _replica_died(self, r: Replica, gen: int, reason: str) -> None:
        """A request sent to ``r`` (generation ``gen``) met ``ActorDiedError``."""
        raise NotImplementedError

    def _refresh(self, max_age: float = 0.0) -> None:
        """Learn of replica changes made elsewhere if what we know is older than
        ``max_age`` s (called while waiting for a replica, and before a fanout)."""

    def _unavailable_detail(self) -> str:
        states = ", ".join(f"{r.index}={r.state}" for r in self.replicas)
        errors = "; ".join(r.last_error for r in self.replicas if r.last_error)
        return f"(replicas: {states or 'none'})" + (f"; last errors: {errors}" if errors else "")

    # -- endpoints -----------------------------------------------------------------------
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
            ep = self._endpoints[name] = self._endpoint_type(self, attr)
            return ep
        raise AttributeError(f"{self._cls.__name__} has no endpoint {name!r}")

    def request_counts(self) -> dict[str, int]:
        """``route`` requests through this handle: ``sent``, ``retried`` (re-sent after their
        replica died), ``completed``, ``failed`` (an error reached the caller) and
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

    def _mark_down(self, r: Replica, gen: int, reason: str) -> bool:
        """Take generation ``gen`` of ``r`` out of rotation and re-home its sessions (call
        with the lock); ``False`` if that generation was already down or replaced."""
        if r.gen != gen or r.state != HEALTHY:
            return False
        r.state = UNHEALTHY
        r.last_error = reason
        r.down_since = time.monotonic()
        self._rehome(r)
        return True

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
    # retries), and a one-rank replica is called straight (``ActorMesh._first_value``).
    def _pick(self, sid: str | None, tried: set[tuple[int, int]] | None) -> Replica | None:
        with self._lock:
            if tried:
                # a replica generation this request died on is out; a restarted replica (a
                # new generation) is a new place to try, after any replica not yet tried
                healthy = [
                    r for r in self.replicas if r.state == HEALTHY and (r.index, r.gen) not in tried
                ]
                dead_on = {index for index, _ in tried}
                fresh = [r for r in healthy if r.index not in dead_on]
                healthy = fresh or healthy
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
                raise ServiceUnavailable(
                    f"service {self.name!r} has no healthy replica after waiting "
                    f"{self.config.unavailable_timeout} s {self._unavailable_detail()}"
                )
            await asyncio.sleep(min(self.config.health_poll_rate, left))
            self._refresh()

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
                value = await mesh._first_value(ep, args, kwargs)
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
                self._replica_died(r, gen, str(e))
            raise
        with r.lock:
            r.in_flight -= 1
            r.total += 1
            r.ok += 1
            r.latencies.append(time.monotonic() - t0)  # pyright: ignore[reportOperatorIssue]  # sent: t0 set
        return value

    async def _route(self, ep: str, args, kwargs, sid: str | None) -> Any:
        """One ``route`` request: a healthy replica (the session's, if any) answers. If its
        replica dies, it is re-sent, up to ``max_retries`` times, never twice to the same
        replica generation: to a replica not tried yet if there is one, else to a replica the
        service restarted (waiting up to ``unavailable_timeout`` for one). Counted in
        ``request_counts``."""
        with self._lock:
            self._requests["sent"] += 1
        # (replica index, generation) this request died on (made at the first death): the
        # poison-pill bound is the number of deaths (max_retries + 1), not the replica count,
        # so a one-replica service survives the loss of its replica's host.
        tried: set[tuple[int, int]] | None = None
        last: ActorDiedError | None = None

        def pick():
            r = self._pick(sid, tried)
            if r is None and last is not None and not self._may_recover():
                raise last  # the replicas it died on will not come back
            return r

        try:
            while True:
                r = None if self._stopped else self._pick(sid, tried)
                if r is None:
                    try:
                        r = await self._wait_for(pick)
                    except ServiceUnavailable as e:
                        if last is None:
                            raise
                        raise ServiceUnavailable(
                            f"{e} (a {self.name}.{ep} request died on its replica: {last})"
                        ) from last
                gen = r.gen
                try:
                    value = await self._call(r, ep, args, kwargs)
                    break
                except Stale:
                    continue
                except ActorDiedError as e:
                    last = e
                    tried = tried or set()
                    tried.add((r.index, gen))
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

    def _may_recover(self) -> bool:
        """Whether a replica that is down may serve again (the service is restarting it, or
        it is down but still wanted): worth waiting for."""
        with self._lock:
            return any(r.wanted and r.state in (UNHEALTHY, RECOVERING) for r in self.replicas)

    async def _fanout(self, ep: str, args, kwargs) -> dict[int, Any]:
        """Every healthy replica answers; ``{replica index: value}``. A replica that dies
        meanwhile is skipped; any other error is raised once all have answered."""
        self._refresh(self.config.health_poll_rate)  # reach replicas restarted meanwhile

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


class ServiceEndpoint:
    """An endpoint of a service: call it with ``route`` or ``fanout``."""

    def __init__(self, svc: Routing, prop: EndpointProperty):
        self._svc = svc
        self.name = prop.name
        self._route_what = f"{svc.name}.{prop.name}.route"

    def __repr__(self) -> str:
        return f"<service endpoint {self._svc.name}.{self.name}>"

    def __reduce__(self):
        return (getattr, (self._svc, self.name))  # the service pickles to a ServiceRef

    def route(self, *args: Any, sess_id: str | None = None, **kwargs: Any) -> Future:
        """One healthy replica answers (rank 0's value). ``sess_id`` (or an enclosing
        ``async with svc.session()``) keeps a conversation on one replica."""
        svc = self._svc
        sid = sess_id if sess_id is not None else svc._session_var.get()
        return Future(lambda: svc._route(self.name, args, kwargs, sid), self._route_what)

    def fanout(self, *args: Any, **kwargs: Any) -> Future[list]:
        """Every healthy replica answers; one value per replica that answered, in replica
        order. Replicas that die meanwhile are skipped (``fanout_by_replica`` says which)."""

        async def run():
            return list((await self._svc._fanout(self.name, args, kwargs)).values())

        return Future(run, f"{self._svc.name}.{self.name}.fanout")

    def fanout_by_replica(self, *args: Any, **kwargs: Any) -> Future[dict[int, Any]]:
        """Like ``fanout``, as ``{replica index: value}`` for the replicas that answered."""
        return Future(
            lambda: self._svc._fanout(self.name, args, kwargs),
            f"{self._svc.name}.{self.name}.fanout",
        )

    def _misuse(self, adverb: str):
        raise TypeError(
            f"{self!r} belongs to a service, which has no .{adverb}(): use "
            f"`await svc.{self.name}.route(...)` for one replica or "
            f"`await svc.{self.name}.fanout(...)` for every healthy replica"
        )

    def __call__(self, *args, **kwargs):
        self._misuse("__call__")

    def call(self, *args, **kwargs):
        self._misuse("call")

    def call_one(self, *args, **kwargs):
        self._misuse("call_one")

    def choose(self, *args, **kwargs):
        self._misuse("choose")

    def broadcast(self, *args, **kwargs):
        self._misuse("broadcast")

    def stream(self, *args, **kwargs):
        self._misuse("stream")


Routing._endpoint_type = ServiceEndpoint
