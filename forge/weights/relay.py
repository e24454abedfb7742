"""Pushed weights across hosts that share nothing: one copy per host.

A shm version lives in the pushing trainer's ``/dev/shm``. A puller on another host cannot
open it, so ``localize(handle)`` copies it to its own host first: the first puller on a host
copies it into ``/dev/shm/forge-w-relay-<push id>-v<version>`` under a file lock, over the
session's authenticated channel, in a chain of hosts (``controller.files.fetch_relayed``):
the first host to ask copies from the pushing worker, each later one from the host that asked
before it, while that host still receives it; so the pusher's link carries each byte once
however many hosts pull, and a chunk moves on as soon as it arrives. A host whose parent
fails copies the rest from the pusher. Every other replica on a host waits for its host's copy
and then maps it as it would the trainer's file (the zero-copy lease of one host stays). The copy is named by the
push's id, so a version number pushed again after a restart is never mistaken for the old
bytes, and a host keeps the newest ``KEEP`` copies.

The latest handle is also kept at the controller (``remember_latest``), so a replica restarted
on a host that has no copy yet finds the version to load (``recall_latest``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import glob
import os

from controller import files
from controller._home import recall, remember_sync
from controller._serialization import shm_prefix
from forge.weights.store import WeightHandle

__all__ = ["localize", "localize_sync", "recall_latest", "remember_latest"]

KEEP = 3  # relayed versions a host keeps (keep_last=2 + the one being loaded)


def _needs_copy(handle: WeightHandle) -> bool:
    return handle.transport == "shm" and bool(handle.source) and not os.path.exists(handle.location)


def _local_path(handle: WeightHandle) -> str:
    shm_dir = os.path.dirname(handle.location)
    # Ends in the session's tag, so the next session's sweep removes a copy a killed session
    # left (on a host where a root controller starts: docs/security.md, "Shared hosts").
    name = f"forge-w-relay-{handle.uid}-v{handle.version}.{shm_prefix()}"
    return os.path.join(shm_dir, name)


async def localize(handle: WeightHandle) -> WeightHandle:
    """``handle`` readable on this host: itself where its file is here; else a handle to this
    host's copy, fetched from the pusher once per host (see module doc)."""
    if not _needs_copy(handle):
        return handle
    local = _local_path(handle)
    if not os.path.exists(local):
        loop = asyncio.get_running_loop()
        fd = os.open(f"{local}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            await loop.run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
            if not os.path.exists(local):  # another replica on this host may have copied it
                key = f"{handle.uid}-v{handle.version}"
                await files.fetch_relayed(handle.source, handle.location, local, key)
                _prune(os.path.dirname(local))
        finally:
            os.close(fd)
    return dataclasses.replace(handle, location=local)


def localize_sync(handle: WeightHandle) -> WeightHandle:
    """``localize`` for code that is not async (runs on the runtime's background loop)."""
    if not _needs_copy(handle):
        return handle
    return files._run_sync(localize(handle))


def _prune(shm_dir: str) -> None:
    copies = sorted(
        glob.glob(os.path.join(shm_dir, f"forge-w-relay-*-v*[0-9].{shm_prefix()}")),
        key=os.path.getmtime,
    )
    for old in copies[:-KEEP]:  # mappings still open keep their memory until unmapped
        files.unpublish(old)
        for path in (old, f"{old}.lock"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _key(prefix: str) -> str:
    return f"forge.weights.latest:{prefix}"


def remember_latest(prefix: str, handle: WeightHandle) -> None:
    """Keep ``handle`` at the controller as the newest version under ``prefix``."""
    remember_sync(_key(prefix), handle)


async def recall_latest(prefix: str) -> WeightHandle | None:
    """The newest handle pushed under ``prefix`` (``None``: none, or one host only)."""
    return await recall(_key(prefix))
