"""Supervision: what a mesh's owner is told when one of its processes dies or a ``broadcast``
fails (``MeshFailure``), and how it is handed to the owner's ``__supervise__``.

``MeshFailure`` is public as ``controller.MeshFailure`` (and ``controller.mesh.MeshFailure``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("controller")


@dataclass
class MeshFailure:
    """What ``__supervise__`` receives when a process of a mesh it owns dies unexpectedly,
    or a ``broadcast`` it sent fails."""

    mesh: str
    rank: int | None
    pid: int | None
    returncode: int | None
    message: str
    error: BaseException | None = None


def supervise(owner, loop, failure: MeshFailure) -> None:
    """Hand ``failure`` to ``owner.__supervise__``; log loudly if nobody handles it."""

    def deliver():
        handled = False
        hook = getattr(owner, "__supervise__", None)
        if hook is not None:
            try:
                handled = bool(hook(failure))
            except Exception:
                logger.exception("__supervise__ of %r raised", owner)
        if not handled:
            logger.error("UNHANDLED FAILURE: %s", failure.message)

    if loop is not None and not loop.is_closed():
        try:
            loop.call_soon_threadsafe(deliver)
            return
        except RuntimeError:
            pass
    deliver()
