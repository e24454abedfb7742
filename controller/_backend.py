"""Choosing where processes come from: ``FORGE_BACKEND`` names the launcher.

``local`` (default) starts actor processes on this host (below); ``ray`` asks a Ray cluster
for them (``controller._ray``: the cluster in ``RAY_ADDRESS``, or a Ray instance of its own on
this host); ``monarch`` asks Monarch (``controller._monarch``: this host, or the hosts of a
Monarch job registered with ``use_host_mesh``). Each is a module with the launcher interface
of ``controller._launch``; the result is an ordinary ``ProcMesh``, so actors, adverbs and
services run unchanged.
"""

from __future__ import annotations

import importlib
import os

from controller import env_vars
from controller.mesh import HostMesh, ProcMesh

LAUNCHERS = {  # FORGE_BACKEND -> the module whose ``launch(opts, name)`` starts a mesh
    "local": "controller._backend",
    "ray": "controller._ray",  # imports ray: only when chosen
    "monarch": "controller._monarch",  # imports monarch: only when chosen
}


def backend_name() -> str:
    """``FORGE_BACKEND``: ``local`` (default), ``ray`` or ``monarch``."""
    return env_vars.backend()


async def spawn_procs_for(opts, name: str) -> ProcMesh:
    """A process mesh as ``opts`` (an ``ActorOptions``) describes it, from the chosen backend."""
    module = importlib.import_module(LAUNCHERS[backend_name()])
    return await module.launch(opts, name)


async def launch(opts, name: str) -> ProcMesh:
    """The local launcher: ``opts.procs`` processes on this host (one GPU each, disjoint from
    every other mesh's, with ``with_gpus``)."""
    if not opts.with_gpus:
        return await HostMesh(opts.hosts or 1).spawn_procs(
            per_host={"procs": opts.procs}, env_vars=dict(opts.env_vars), name=name
        )
    from controller._gpus import get_allocator

    if (opts.hosts or 1) > 1:
        raise ValueError(
            "with_gpus=True on the local backend provisions this host's GPUs; for several "
            "hosts use FORGE_BACKEND=ray"
        )
    alloc = get_allocator()
    owner = f"mesh {name!r} ({name}-{id(opts)}-{os.getpid()})"
    gpus = alloc.allocate(opts.procs, owner)
    try:
        pm = await HostMesh(1).spawn_procs(
            per_host={"procs": opts.procs},
            env_vars=dict(opts.env_vars),
            name=name,
            rank_env_vars=lambda r: {"CUDA_VISIBLE_DEVICES": gpus[r]},
        )
    except BaseException:
        alloc.release(owner)
        raise
    pm.gpus = gpus
    pm.on_stop(lambda: alloc.release(owner))
    return pm


def use_host_mesh(host_mesh) -> None:
    """Place ``FORGE_BACKEND=monarch`` meshes on ``host_mesh``, a Monarch ``HostMesh`` (e.g.
    ``SlurmJob(...).state().workers``); ``None`` goes back to this host. See docs/multihost.md."""
    from controller._monarch import use_host_mesh as _use  # imports monarch: only when used

    _use(host_mesh)
