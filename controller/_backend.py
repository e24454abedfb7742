"""Choosing where processes come from: the local backend (default) or Monarch."""

from __future__ import annotations

import os

from controller.mesh import HostMesh, ProcMesh


def backend_name() -> str:
    """``FORGE_BACKEND``: ``local`` (default) or ``monarch``."""
    name = os.environ.get("FORGE_BACKEND", "local").strip().lower() or "local"
    if name not in ("local", "monarch"):
        raise ValueError(f"unknown FORGE_BACKEND {name!r}; choose one of ['local', 'monarch']")
    return name


async def spawn_procs_for(opts, name: str) -> ProcMesh:
    """A process mesh as ``opts`` (an ``ActorOptions``) describes it."""
    if opts.with_gpus:
        raise NotImplementedError("with_gpus=True needs the GPU provisioner (not built yet)")
    return await HostMesh(opts.hosts or 1).spawn_procs(
        per_host={"procs": opts.procs}, env=dict(opts.env), name=name
    )
