"""What a ``Service`` becomes when it is pickled into another process: a ``ServiceRef``.

An actor that receives a service (as an endpoint argument or in its constructor) calls it the
same way the controller does::

    @endpoint
    async def work(self, svc):
        y = await svc.echo.route(x)          # one healthy replica
        ys = await svc.echo.fanout(x)        # every healthy replica

The ref routes by itself, straight to the replicas' processes: no hop through the
controller. The controller-side ``Service`` stays the one place that supervises and restarts
replicas; once it has been pickled it keeps its replica table (index, generation, actor mesh
of every healthy replica) in a file in the session directory, replaced atomically on every
change. The ref reads that table when it has no usable replica left in what it knows: after a
replica dies under a request (the request is re-sent to another replica, up to
``max_retries`` times, like the service's own), and while waiting up to
``unavailable_timeout`` for a restarted one. Where the session directory is not visible (a
Monarch worker on another host), the ref routes over the replicas it was sent with.

Not supported through a ref: sessions (``sess_id``), ``scale``, ``shutdown`` and metrics;
those stay with the controller's ``Service``.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import time
from typing import Any

from controller.endpoint import EndpointProperty, Future
from controller.errors import ActorDiedError, ServiceUnavailable

Entry = tuple  # (replica index, generation, state, ActorMesh)


class ServiceRef:
    """A handle to a service's replicas from another process; endpoints are attributes."""

    def __init__(self, name: str, cls: type, table_path: str, config) -> None:
        self.name = name
        self._cls = cls
        self._table_path = table_path
        self._config = config
        self._rr = itertools.count()
        self._entries: list[Entry] = []
        self._stopped = False
        self._read_at = 0.0
        self._refresh()

    def __reduce__(self):
        return (ServiceRef, (self.name, self._cls, self._table_path, self._config))

    def __repr__(self) -> str:
        return f"<ServiceRef {self.name} replicas={[e[0] for e in self._entries]}>"

    def __getattr__(self, name: str) -> ServiceRefEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._cls, name, None)
        if isinstance(attr, EndpointProperty):
            return ServiceRefEndpoint(self, name)
        raise AttributeError(f"{self._cls.__name__} has no endpoint {name!r}")

    # -- the replica table ---------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-read the table the controller's service keeps (keep what we know if it is not
        readable here)."""
        try:
            with open(self._table_path, "rb") as f:
                table = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            return
        self._entries = list(table["replicas"])
        self._stopped = bool(table["stopped"])
        self._read_at = time.monotonic()

    async def _wait_for(self, pick):
        """``pick()`` until it gives something, re-reading the table; bounded like the
        service's own wait (``unavailable_timeout``)."""
        deadline = time.monotonic() + self._config.unavailable_timeout
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
                    f"{self._config.unavailable_timeout} s (seen from a pickled service handle)"
                )
            await asyncio.sleep(min(self._config.health_poll_rate, left))
            self._refresh()

    # -- requests --------------------------------------------------------------------------
    async def _route(self, ep: str, args, kwargs) -> Any:
        tried: set[tuple[int, int]] = set()  # (index, generation): a restarted one is new
        last: ActorDiedError | None = None

        def pick():
            fresh = [e for e in self._entries if (e[0], e[1]) not in tried]
            if not fresh and last is not None and len(tried) > self._config.max_retries:
                raise last
            if not fresh:
                return None
            return fresh[next(self._rr) % len(fresh)]

        while True:
            entry = await self._wait_for(pick)
            try:
                values = await entry[3].endpoint(ep).call(*args, **kwargs)
            except ActorDiedError as e:
                last = e
                tried.add((entry[0], entry[1]))
                self._entries = [x for x in self._entries if x is not entry]
                if len(tried) > self._config.max_retries:
                    raise
                self._refresh()
                continue
            return values.values()[0]

    async def _fanout(self, ep: str, args, kwargs) -> dict[int, Any]:
        if time.monotonic() - self._read_at > self._config.health_poll_rate:
            self._refresh()  # a fanout must reach replicas restarted since the last read
        targets = await self._wait_for(lambda: list(self._entries))
        results = await asyncio.gather(
            *(e[3].endpoint(ep).call(*args, **kwargs) for e in targets), return_exceptions=True
        )
        out: dict[int, Any] = {}
        for e, res in zip(targets, results):
            if isinstance(res, ActorDiedError):
                self._entries = [x for x in self._entries if x is not e]
                continue
            if isinstance(res, BaseException):
                raise res
            out[e[0]] = res.values()[0]
        if not out:
            raise ServiceUnavailable(f"service {self.name!r}: every replica died during fanout")
        return out


class ServiceRefEndpoint:
    """An endpoint of a pickled service: ``route``, ``fanout`` and ``fanout_by_replica``."""

    def __init__(self, ref: ServiceRef, name: str) -> None:
        self._ref, self.name = ref, name

    def __repr__(self) -> str:
        return f"<service endpoint {self._ref.name}.{self.name} (pickled handle)>"

    def route(self, *args: Any, sess_id: str | None = None, **kwargs: Any) -> Future:
        """One healthy replica answers; re-sent to another if the replica dies meanwhile."""
        if sess_id is not None:
            raise TypeError(
                f"{self!r}: sessions are not supported through a pickled service handle; "
                "route without sess_id, or keep session traffic in the controller"
            )
        return Future(
            lambda: self._ref._route(self.name, args, kwargs), f"{self._ref.name}.{self.name}"
        )

    def fanout(self, *args: Any, **kwargs: Any) -> Future[list]:
        """Every healthy replica answers; one value per replica that answered, in order."""

        async def run():
            return list((await self._ref._fanout(self.name, args, kwargs)).values())

        return Future(run, f"{self._ref.name}.{self.name}.fanout")

    def fanout_by_replica(self, *args: Any, **kwargs: Any) -> Future[dict[int, Any]]:
        """Like ``fanout``, as ``{replica index: value}`` for the replicas that answered."""
        return Future(
            lambda: self._ref._fanout(self.name, args, kwargs),
            f"{self._ref.name}.{self.name}.fanout",
        )
