"""Helpers for driving Forge cell by cell in Jupyter (top-level ``await``).

``await once("trainer", lambda: Trainer.as_actor(cfg))`` spawns on the first run of a cell and
returns the same handle when the cell is run again, so re-running setup cells never
double-spawns. ``await stop_all()`` stops everything (and forgets the handles).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

_handles: dict[str, Any] = {}


async def once(name: str, factory: Callable[[], Awaitable[Any]]) -> Any:
    """The handle spawned under ``name``, spawning it with ``factory()`` the first time."""
    if name not in _handles:
        _handles[name] = await factory()
    return _handles[name]


def handles() -> dict[str, Any]:
    """What ``once`` has spawned so far, by name."""
    return dict(_handles)


async def stop_all() -> None:
    """Stop every actor and service of this session and forget the handles."""
    from controller import shutdown

    _handles.clear()
    await shutdown()
