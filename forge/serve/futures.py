"""The futures of the Tinker API: every queued call returns a request id at once; the client
polls ``retrieve_future`` until the work is done.

``FutureTable.submit`` starts the work as an asyncio task; ``retrieve`` waits up to a bound for
it and answers ``try_again`` (the SDK polls again), the result (a JSON dict, or protobuf bytes
for the types the SDK reads as protobuf), or the API's failure shape with a category: ``user``
for a request this server refuses (bad input, unsupported call), ``server`` otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("forge.serve")

KEEP_S = 900.0  # a finished result stays retrievable this long (the SDK may poll twice)


class UserError(ValueError):
    """A request this server refuses; the message says what to change."""


USER_ERROR_TYPES = (
    "UserError",
    "BadRequest",
    "DatumError",
    "WireError",
    "KeyError",
    "UnsafeCheckpointError",
)


def category(e: BaseException) -> str:
    """``user`` when the request was at fault (the types above, also raised inside an actor),
    else ``server``."""
    name = getattr(e, "remote_type", None) or type(e).__name__
    return "user" if name in USER_ERROR_TYPES else "server"


def message(e: BaseException) -> str:
    remote = getattr(e, "remote_message", None)
    if remote is not None:
        return f"{e.actor}.{e.endpoint}: {remote}"  # type: ignore[attr-defined]
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


class Stats:
    """Per kind of call: how many, seconds from submission to result (``total_s``) and
    seconds inside Forge's actors (``actor_s``); the rest of ``total_s`` is waiting for
    earlier calls. ``GET /forge/v1/stats`` returns them (benchmarks/tinker_loop.py)."""

    def __init__(self) -> None:
        self.kinds: dict[str, dict[str, float]] = {}

    def _kind(self, kind: str) -> dict[str, float]:
        return self.kinds.setdefault(kind, {"n": 0, "total_s": 0.0, "actor_s": 0.0})

    def finished(self, kind: str, seconds: float) -> None:
        k = self._kind(kind)
        k["n"] += 1
        k["total_s"] += seconds

    @contextlib.asynccontextmanager
    async def timed(self, kind: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._kind(kind)["actor_s"] += time.perf_counter() - t0


@dataclass
class _Entry:
    task: asyncio.Task
    created: float


class FutureTable:
    """Request ids to running or finished work."""

    def __init__(self, wait_s: float, stats: Stats | None = None) -> None:
        self.wait_s = wait_s
        self.stats = stats or Stats()
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)

    def submit(
        self, work: Awaitable[Any], model_id: str | None = None, kind: str = "other"
    ) -> dict:
        """Start ``work``; the API's ``UntypedAPIFuture`` for it."""
        self._evict()
        request_id = f"forge-{next(self._ids)}"
        task = asyncio.ensure_future(work)
        task.add_done_callback(_log_failure(request_id))
        t0 = time.perf_counter()
        task.add_done_callback(lambda _: self.stats.finished(kind, time.perf_counter() - t0))
        self._entries[request_id] = _Entry(task, time.monotonic())
        out = {"request_id": request_id}
        if model_id is not None:
            out["model_id"] = model_id
        return out

    async def retrieve(self, request_id: str) -> Any:
        """The result, or the ``try_again`` / failure dicts of the API."""
        entry = self._entries.get(request_id)
        if entry is None:
            return {
                "error": f"unknown request id {request_id!r} (finished results are kept "
                f"{KEEP_S:.0f} s; a restarted server forgets all)",
                "category": "user",
            }
        done, _ = await asyncio.wait({entry.task}, timeout=self.wait_s)
        if not done:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        exc = entry.task.exception()
        if exc is not None:
            return {"error": message(exc), "category": category(exc)}
        return entry.task.result()

    def pending(self) -> int:
        return sum(not e.task.done() for e in self._entries.values())

    def cancel_all(self) -> None:
        for e in self._entries.values():
            e.task.cancel()

    def _evict(self) -> None:
        now = time.monotonic()
        old = [k for k, e in self._entries.items() if e.task.done() and now - e.created > KEEP_S]
        for k in old:
            del self._entries[k]


def _log_failure(request_id: str):
    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and (e := task.exception()) is not None:
            level = logging.INFO if category(e) == "user" else logging.ERROR
            logger.log(level, "request %s failed: %s", request_id, message(e))

    return done
