"""Helpers for driving Forge cell by cell in Jupyter (top-level ``await``).

``await once("trainer", lambda: Trainer.as_actor(cfg))`` spawns on the first run of a cell and
returns the same handle when the cell is run again, so re-running setup cells never
double-spawns. ``await stop_all()`` stops everything (and forgets the handles).
``status()`` as a cell's last line shows this session's services, replicas and meshes (and
the RL fields an app published) as ``forge top`` would; ``status(run_dir)`` shows a run's
``status.json`` from ``forge run``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
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


def status(run_dir: str | Path | None = None) -> Any:
    """The live view of ``forge top`` as a rich renderable (Jupyter displays it as a cell's
    output): this session's runtime now, or the snapshot ``forge run`` wrote to ``run_dir``."""
    from forge.observability.status_view import find_status_file, load_status, render

    if run_dir is not None:
        path = find_status_file(run_dir)
        return render(load_status(path), path)
    from controller.status import status_snapshot

    snap = status_snapshot()
    snap.update(state="running", started_at=snap["updated_at"], info={"app": "notebook"})
    return render(snap, Path.cwd() / "(this kernel)", now=time.time())
