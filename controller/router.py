"""Routers: which healthy replica of a service takes a request.

A router is a small object with ``choose(replicas, sess_id) -> replica``. ``replicas`` is the
non-empty list of healthy replicas a request may go to (each has ``index``, ``in_flight`` and
``sessions``); ``sess_id`` is the request's session, or ``None``. Sticky sessions are kept
by the service itself: a router is asked only for requests without a session (and the
service places *new* sessions with ``LeastLoadedRouter``).

``build_router("round_robin" | "least_loaded" | Router())`` picks one by name.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any


class Router:
    """Base class of routers. Subclass it and implement ``choose``."""

    def choose(self, replicas: Sequence[Any], sess_id: str | None) -> Any:
        raise NotImplementedError


class RoundRobinRouter(Router):
    """Each request to the next replica in turn (the default)."""

    def __init__(self):
        self._counter = itertools.count()

    def choose(self, replicas, sess_id):
        return replicas[next(self._counter) % len(replicas)]


class LeastLoadedRouter(Router):
    """The replica with the fewest requests in flight; ties go to the one with the fewest
    sessions, then the lowest index."""

    def choose(self, replicas, sess_id):
        return min(replicas, key=lambda r: (r.in_flight, r.sessions, r.index))


ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "least_loaded": LeastLoadedRouter,
}


def build_router(spec: str | Router) -> Router:
    """A router from its name, or ``spec`` itself if it already is one."""
    if isinstance(spec, Router):
        return spec
    if isinstance(spec, str) and spec in ROUTERS:
        return ROUTERS[spec]()
    raise ValueError(
        f"unknown router type: {spec!r}; choose one of {sorted(ROUTERS)} or pass a Router"
    )
