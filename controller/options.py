"""``ActorOptions``: how to place an actor, as given to ``Actor.options(...)``.

Kept apart from ``controller/actor.py`` so that what spawns actors (``controller/_spawn.py``)
and services (``controller/service.py``) can use it without importing ``Actor``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ActorOptions:
    """How to place an actor. ``extra`` holds service options (``health_poll_rate``, ...)."""

    procs: int = 1
    hosts: int | None = None
    with_gpus: bool = False
    num_replicas: int = 1
    mesh_name: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)  # the processes' environment
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for key in ("procs", "num_replicas"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"options({key}=...) must be a positive int, got {v!r}")
        if self.hosts is not None and (not isinstance(self.hosts, int) or self.hosts < 1):
            raise ValueError(
                f"options(hosts=...) must be a positive int or None, got {self.hosts!r}"
            )
