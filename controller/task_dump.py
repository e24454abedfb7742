"""``kill -USR1 <pid>``: print every asyncio task of a Forge process with the chain of
awaits it is suspended in, to stderr. For a run that stopped moving while every thread is
idle (``py-spy dump`` shows threads, not coroutines): the dump says which await is waiting.

Installed by ``controller.loops.run`` (the entry point of ``forge run`` and of every actor
process) on the main thread's loop; ``FORGE_TASK_DUMP=0`` leaves the signal alone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

from controller import env_vars

__all__ = ["await_chain", "dump_tasks", "install"]


def await_chain(coro) -> list[str]:
    """``file:line in function`` for each frame of the awaits ``coro`` is suspended in,
    outermost first (coroutines, generators and async generators; a future ends it)."""
    out = []
    while coro is not None:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is None:
            if isinstance(coro, asyncio.Future):
                out.append(f"<awaiting {type(coro).__name__} {coro!r:.120}>")
            break
        out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
            or _wrapped(frame)
        )
    return out


def _wrapped(frame):
    """The coroutine an ``__await__`` that drives one by hand (``controller._worker``'s eager
    calls) keeps in a local named ``coro``, else ``None``."""
    inner = frame.f_locals.get("coro") if frame.f_code.co_name == "__await__" else None
    return inner if inner is not None and hasattr(inner, "cr_frame") else None


def dump_tasks(file=None) -> None:
    """Print this loop's tasks and their await chains."""
    file = file or sys.stderr
    tasks = asyncio.all_tasks()
    print(f"[task dump] pid {os.getpid()}: {len(tasks)} tasks", file=file)
    for task in tasks:
        print(f"  task {task.get_name()}:", file=file)
        for line in await_chain(task.get_coro()):
            print(f"    {line}", file=file)
    file.flush()


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Dump the tasks on SIGUSR1 (main thread only; a no-op where signals cannot be set)."""
    if not env_vars.task_dump() or not hasattr(signal, "SIGUSR1"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
