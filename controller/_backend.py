"""Choosing where processes come from: the local backend (default) or Monarch.

``FORGE_BACKEND=local`` starts actor processes on this host (``controller._local``);
``FORGE_BACKEND=monarch`` asks Monarch for them (``controller._monarch``: this host, or the
hosts of a Monarch job registered with ``use_host_mesh``); ``FORGE_BACKEND=hosts`` asks Forge
host agents on other hosts (``controller._hosts``, ``FORGE_HOSTS``). Either way the result is an
ordinary ``ProcMesh``, so actors, adverbs and services run unchanged.
"""

from __future__ import annotations

import os

from controller import env
from controller.mesh import HostMesh, ProcMesh


def backend_name() -> str:
    """``FORGE_BACKEND``: ``local`` (default), ``monarch`` or ``hosts``."""
    return env.backend()


async def spawn_procs_for(opts, name: str) -> ProcMesh:
    """A process mesh as ``opts`` (an ``ActorOptions``) describes it."""
    if opts.with_gpus:
        return await _spawn_with_gpus(opts, name)
    if backend_name() == "monarch":
        from controller._monarch import spawn_monarch  # imports monarch: only when chosen

        return await spawn_monarch(opts.hosts or 1, {"procs": opts.procs}, dict(opts.env), name)
    if backend_name() == "hosts":
        from controller._hosts import spawn_on_hosts

        return await spawn_on_hosts(opts, name)
    return await HostMesh(opts.hosts or 1).spawn_procs(
        per_host={"procs": opts.procs}, env=dict(opts.env), name=name
    )


def use_host_mesh(host_mesh) -> None:
    """Place ``FORGE_BACKEND=monarch`` meshes on ``host_mesh``, a Monarch ``HostMesh`` (e.g.
    ``SlurmJob(...).state().workers``); ``None`` goes back to this host. See docs/multihost.md."""
    from controller._monarch import use_host_mesh as _use  # imports monarch: only when used

    _use(host_mesh)


async def _spawn_with_gpus(opts, name: str) -> ProcMesh:
    """One GPU per process, disjoint from every other mesh's, released when the mesh stops."""
    from controller._gpus import get_allocator

    if backend_name() != "local" or (opts.hosts or 1) > 1:
        raise ValueError(
            "with_gpus=True is provisioned on the local backend (one host); on Monarch the "
            "allocator's hosts own their GPUs"
        )
    alloc = get_allocator()
    owner = f"{name}-{id(opts)}-{os.getpid()}"
    gpus = alloc.allocate(opts.procs, f"mesh {name!r} ({owner})")
    try:
        pm = await HostMesh(1).spawn_procs(
            per_host={"procs": opts.procs},
            env=dict(opts.env),
            name=name,
            rank_env=[{"CUDA_VISIBLE_DEVICES": g} for g in gpus],
        )
    except BaseException:
        alloc.release(f"mesh {name!r} ({owner})")
        raise
    pm.gpus = gpus
    pm.on_stop(lambda: alloc.release(f"mesh {name!r} ({owner})"))
    return pm
