"""What a ``Service`` becomes when it is pickled into another process: a ``ServiceRef``.

An actor that receives a service (as an endpoint argument or in its constructor) calls it the
same way the controller does::

    @endpoint
    async def work(self, svc):
        y = await svc.echo.route(x)          # one healthy replica
        ys = await svc.echo.fanout(x)        # every healthy replica

The ref routes by itself, straight to the replicas' processes: no hop through the
controller, and through the same routing core as the controller's ``Service``
(controller/_routing.py): the service's configured router, its concurrency cap (per replica,
per event loop of this process), and its failover (a request whose replica dies is re-sent to
another replica or a restarted one, up to ``max_retries`` times, never twice to the same
replica generation). The controller-side ``Service`` stays the one place that supervises and
restarts replicas; once it has been pickled it keeps its replica table (index, generation,
state and, when healthy, actor mesh of every replica) in a file in the session directory,
replaced atomically on every change (``write_table``). The ref re-reads it after a replica dies under one of its requests,
while waiting up to ``unavailable_timeout`` for a healthy replica, and before a ``fanout``
when its copy is older than ``health_poll_rate``. Where the session directory is not visible
(a worker on a host that shares nothing with the controller) it asks the controller's home
(``controller._home``) for the file instead; without a home (a Monarch worker on another
host) the ref routes over the replicas it was sent with.

Not supported through a ref: sessions, ``scale``, ``shutdown`` and metrics; those stay with
the controller's ``Service``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import threading
import time
from typing import Any

from controller._routing import Routing, ServiceEndpoint
from controller._service_types import HEALTHY, STOPPED, UNHEALTHY, Replica, ServiceConfig
from controller.future import Future

logger = logging.getLogger("controller")

Row = tuple  # (replica index, generation, state, ActorMesh or None)
TABLE_TIMEOUT_S = 10.0


def write_table(path: str, stopped: bool, rows: list[Row]) -> None:
    """Atomically replace the replica table at ``path`` (raises ``OSError``)."""
    table = {"stopped": stopped, "replicas": rows}
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(table, f)
    os.replace(tmp, path)


def read_table(path: str) -> dict[str, Any] | None:
    """The replica table at ``path``, or ``None`` where it cannot be read from here."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


_NO_SESSIONS = (
    "sessions are not supported through a pickled service handle; route without sess_id, "
    "or keep session traffic in the controller"
)


class ServiceRef(Routing):
    """A handle to a service's replicas from another process; endpoints are attributes."""

    def __init__(self, name: str, cls: type, table_path: str, config: ServiceConfig) -> None:
        self._init_routing(name, cls, config)
        self._table_path = table_path
        self._dead: set[tuple[int, int]] = set()  # (index, gen) a request of ours died on
        self._read_at = 0.0
        self._fetching = None  # the fetch of the table from the controller's home in flight
        self._refresh()

    def __reduce__(self):
        return (ServiceRef, (self.name, self._cls, self._table_path, self.config))

    def __repr__(self) -> str:
        healthy = [r.index for r in self.replicas if r.state == HEALTHY]
        return f"<ServiceRef {self.name} replicas={healthy}>"

    # -- the replica table ---------------------------------------------------------------
    def _refresh(self, max_age: float = 0.0) -> None:
        """Re-read the table the controller's service keeps (keep what we know if it is not
        readable here). A replica generation one of our requests died on stays out of
        rotation here even while the table still calls it healthy."""
        if max_age and time.monotonic() - self._read_at <= max_age:
            return
        table = read_table(self._table_path)
        if table is None:
            self._fetch_remote()
            return
        self._apply(table)

    def _fetch_remote(self) -> None:
        """Where the table file is not visible (another host), ask the controller's home for
        it; the answer is applied when it comes (calls meanwhile use what we know)."""
        from controller._home import home

        h = home()
        if h is None or self._fetching is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        async def fetch() -> None:
            try:
                raw = await h.small.call_one(self._table_path, timeout=TABLE_TIMEOUT_S)
                if raw is not None:
                    self._apply(pickle.loads(raw))
            except Exception as e:  # noqa: BLE001 - keep what we know; a later refresh retries
                logger.debug("service %s: could not fetch the replica table: %s", self.name, e)
            finally:
                self._fetching = None

        self._fetching = loop.create_task(fetch())

    def _apply(self, table: dict[str, Any]) -> None:
        with self._lock:
            known = {(r.index, r.gen): r for r in self.replicas}
            fresh: list[Replica] = []
            for index, gen, state, mesh in table["replicas"]:
                r = known.pop((index, gen), None)
                if r is None:
                    r = Replica(index, self.config.replica_max_concurrent_requests)
                    r.gen = gen
                if mesh is not None:
                    r.mesh = mesh
                r.state = UNHEALTHY if (index, gen) in self._dead else state
                fresh.append(r)
            for gone in known.values():  # requests queued for these are routed again
                gone.state = STOPPED
                self._rehome(gone)
            self._dead &= {(r.index, r.gen) for r in fresh}
            self.replicas = fresh
            self._stopped = bool(table["stopped"])
        self._read_at = time.monotonic()

    def _replica_died(self, r: Replica, gen: int, reason: str) -> None:
        with self._lock:
            self._dead.add((r.index, gen))
            if r.gen == gen and r.state == HEALTHY:
                r.state = UNHEALTHY
                r.last_error = reason
        self._refresh()

    def _unavailable_detail(self) -> str:
        return "(seen from a pickled service handle)"

    # -- not through a ref ---------------------------------------------------------------
    def start_session(self) -> Future[str]:
        raise TypeError(f"{self!r}: {_NO_SESSIONS}")

    def terminate_session(self, sid: str) -> Future[None]:
        raise TypeError(f"{self!r}: {_NO_SESSIONS}")

    def session(self):
        raise TypeError(f"{self!r}: {_NO_SESSIONS}")


class ServiceRefEndpoint(ServiceEndpoint):
    """An endpoint of a pickled service: ``route``, ``fanout`` and ``fanout_by_replica``."""

    def __repr__(self) -> str:
        return f"<service endpoint {self._svc.name}.{self.name} (pickled handle)>"

    def route(self, *args: Any, sess_id: str | None = None, **kwargs: Any) -> Future:
        """One healthy replica answers; re-sent to another if the replica dies meanwhile."""
        if sess_id is not None:
            raise TypeError(f"{self!r}: {_NO_SESSIONS}")
        return super().route(*args, **kwargs)


ServiceRef._endpoint_type = ServiceRefEndpoint
