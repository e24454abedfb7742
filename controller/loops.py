"""Event loops for Forge's processes: uvloop when it is installed, else asyncio's own.

A call is a round trip between two event loops, and on a small host most of its time is the
loops' own work (waking from ``epoll``, running callbacks) rather than the bytes. uvloop does
that work in C: an echo over a Unix socket between two asyncio processes took 110-160 us here,
between two uvloop processes 30 us (a blocking ``multiprocessing.Pipe`` ping-pong: 45-90 us).
Actor processes always run on :func:`new_event_loop`; ``forge run`` runs the app on it too.
A program that starts its own loop (``asyncio.run``, Jupyter) keeps it and still works, with
only its own side on the slower loop. ``FORGE_UVLOOP=0`` turns uvloop off everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from controller import env_vars

__all__ = ["new_event_loop", "run", "uvloop_enabled"]

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """Whether :func:`new_event_loop` gives a uvloop loop (installed, not turned off)."""
    if not env_vars.uvloop():
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when enabled, else asyncio's default."""
    if uvloop_enabled():
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on :func:`new_event_loop`: the entry point for Forge programs.
    ``kill -USR1`` on such a process prints its tasks' awaits (``controller.task_dump``)."""
    main = _with_task_dump(main)
    if hasattr(asyncio, "Runner"):  # Python >= 3.11
        with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:  # pyright: ignore[reportAttributeAccessIssue]  # 3.11+
            return runner.run(main)
    if uvloop_enabled():  # Python 3.10: through the policy (this process's loops from now on)
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(main, debug=debug)


async def _with_task_dump(main: Coroutine[Any, Any, T]) -> T:
    from controller import task_dump

    task_dump.install(asyncio.get_running_loop())
    return await main
