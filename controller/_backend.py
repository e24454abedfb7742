"""Choosing where processes come from: the local backend (default) or Monarch.

``FORGE_BACKEND=local`` starts actor processes on this host (``controller._local``);
``FORGE_BACKEND=monarch`` asks Monarch for them (``controller._monarch``: this host, or the
hosts of a Monarch job registered with ``use_host_mesh``). Either way the result is an
ordinary ``ProcMesh``, so actors, adverbs and services run unchanged.
"""

from __future__ import annotations

import os

from controller.mesh import HostMesh, ProcMesh

BACKENDS = ("local", "monarch")


def backend_name() -> str:
    """``FORGE_BACKEND``: ``local`` (default) or ``monarch``."""
    name = os.environ.get("FORGE_BACKEND", "local").strip().lower() or "local"
    if name not in BACKENDS:
        raise ValueError(f"unknown FORGE_BACKEND {name!r}; choose one of {list(BACKENDS)}")
    return name


async def spawn_procs_for(opts, name: str) -> ProcMesh:
    """A process mesh as ``opts`` (an ``ActorOptions``) describes it."""
    if opts.with_gpus:
        raise NotImplementedError("with_gpus=True needs the GPU provisioner (not built yet)")
    if backend_name() == "monarch":
        from controller._monarch import spawn_monarch  # imports monarch: only when chosen

        return await spawn_monarch(opts.hosts or 1, {"procs": opts.procs}, dict(opts.env), name)
    return await HostMesh(opts.hosts or 1).spawn_procs(
        per_host={"procs": opts.procs}, env=dict(opts.env), name=name
    )


def use_host_mesh(host_mesh) -> None:
    """Place ``FORGE_BACKEND=monarch`` meshes on ``host_mesh``, a Monarch ``HostMesh`` (e.g.
    ``SlurmJob(...).state().workers``); ``None`` goes back to this host. See docs/multihost.md."""
    from controller._monarch import use_host_mesh as _use  # imports monarch: only when used

    _use(host_mesh)
