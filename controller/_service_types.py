"""The parts a service is made of: its config and its replicas (see controller/service.py,
controller/_routing.py and docs/services.md)."""

from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.router import Router, build_router

if TYPE_CHECKING:
    from controller.mesh import ActorMesh

HEALTHY, UNHEALTHY, RECOVERING, DRAINING, STOPPED = (
    "healthy",
    "unhealthy",
    "recovering",
    "draining",
    "stopped",
)
MAX_RESTART_DELAY_S = 5.0


@dataclass(frozen=True)
class ServiceConfig:
    """Service options, given to ``options(...)`` next to ``num_replicas`` and ``procs``."""

    num_replicas: int = 1
    health_poll_rate: float = 0.2  # seconds between checks while waiting for a healthy replica
    replica_max_concurrent_requests: int = 10  # per replica (and per event loop); rest queue
    max_retries: int = 2  # re-sends of a request whose replica died (a restarted one counts)
    unavailable_timeout: float = 30.0  # how long route() waits for a replica to recover
    router: str | Router = "round_robin"
    # Active health checks: every ``health_check_interval_s`` each process of every healthy
    # replica is pinged; one that does not answer within ``health_check_timeout_s`` (its event
    # loop is blocked) makes the replica unhealthy: its requests are re-sent elsewhere and it
    # is restarted. The ping is answered by the actor's event loop, so ``def`` endpoints
    # (run in a thread) may work for as long as they need. ``0`` turns the checks off.
    health_check_interval_s: float = 5.0
    health_check_timeout_s: float = 30.0

    @classmethod
    def from_options(cls, opts) -> ServiceConfig:
        known = [k for k in cls.__dataclass_fields__ if k != "num_replicas"]
        unknown = sorted(set(opts.extra) - set(known))
        if unknown:
            raise ValueError(f"unknown service option(s) {unknown}; known options: {known}")
        cfg = cls(num_replicas=opts.num_replicas, **opts.extra)
        for key in ("health_poll_rate", "unavailable_timeout"):
            v = getattr(cfg, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"options({key}=...) must be a number of seconds > 0, got {v!r}")
        for key in ("health_check_interval_s", "health_check_timeout_s"):
            v = getattr(cfg, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(
                    f"options({key}=...) must be a number of seconds >= 0 (0: no health "
                    f"checks), got {v!r}"
                )
        for key, lo in (("replica_max_concurrent_requests", 1), ("max_retries", 0)):
            v = getattr(cfg, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"options({key}=...) must be an int >= {lo}, got {v!r}")
        build_router(cfg.router)  # raises ValueError for an unknown name
        return cfg


class Replica:
    """One replica: its actor mesh, state and counters. Routers see these."""

    def __init__(self, index: int, cap: int):
        self.index = index
        self.mesh: ActorMesh | None = None
        self.gen = 0  # bumped on every (re)start; a death report for an older gen is stale
        self.state = RECOVERING
        self.wanted = True  # False once draining or shut down: restarts stop
        self.sessions = 0
        self.in_flight = 0
        self.total = self.ok = self.failed = self.restarts = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=1000)
        self.last_error: str | None = None
        self.down_since: float | None = None  # monotonic time it was taken out of rotation
        self.last_recovery_s: float | None = None  # down -> healthy again, last restart
        self.lock = threading.Lock()
        self._cap = cap
        self._sems: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def __repr__(self) -> str:
        return f"<Replica {self.index} {self.state} in_flight={self.in_flight}>"

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            self._sems = {lp: s for lp, s in self._sems.items() if not lp.is_closed()}
            sem = self._sems[loop] = asyncio.Semaphore(self._cap)
        return sem

    def metrics(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float | None:
            return round(lat[int(q * (len(lat) - 1))] * 1000, 3) if lat else None

        return {
            "state": self.state,
            "pids": list(self.mesh.pids) if self.mesh is not None else [],
            "requests_total": self.total,
            "requests_ok": self.ok,
            "requests_failed": self.failed,
            "in_flight": self.in_flight,
            "latency_p50_ms": pct(0.5),
            "latency_p99_ms": pct(0.99),
            "sessions": self.sessions,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_recovery_s": self.last_recovery_s,
        }


class Stale(Exception):
    """The replica picked for a request went down before the request was sent."""
