"""``spawn_actor``: one proc mesh with an actor constructed on it and ``setup()`` run.

Used by ``Actor.as_actor`` and by services for each replica (and each restart).
"""

from __future__ import annotations

import asyncio
import dataclasses

from controller._backend import spawn_procs_for
from controller.endpoint import EndpointProperty
from controller.env_vars import PRELOAD
from controller.mesh import ActorMesh
from controller.options import ActorOptions


async def spawn_actor(
    cls: type, opts: ActorOptions, args, kwargs, name: str | None = None
) -> ActorMesh:
    """Spawn a proc mesh for ``opts``, construct ``cls`` on it and run ``setup``."""
    mesh_name = name or opts.mesh_name or cls.__name__
    preload = getattr(cls, "preload", "")
    if preload and PRELOAD not in opts.env_vars:  # the class's own (``Actor.preload``)
        opts = dataclasses.replace(opts, env_vars={**opts.env_vars, PRELOAD: preload})
    pm = await spawn_procs_for(opts, mesh_name)
    try:
        am = pm.spawn(mesh_name, cls, *args, **kwargs)
        am._owns_proc_mesh = True
        await am
        if isinstance(getattr(cls, "setup", None), EndpointProperty):
            await am.endpoint("setup").call()
    except BaseException:
        await asyncio.shield(asyncio.ensure_future(_stop_quietly(pm)))
        raise
    return am


async def _stop_quietly(pm) -> None:
    try:
        await pm.stop()
    except Exception:  # noqa: BLE001 - the original error matters more
        pass
