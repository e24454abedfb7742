"""``Future``: the pending result of every call, spawn and stop in the runtime.

``await fut`` runs it on the caller's event loop; ``fut.get(timeout)`` runs it on the
runtime's background loop, so it works in plain scripts and even inside a running loop
(Jupyter); ``fut.start()`` sends at once instead of at the first await.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from controller._runtime import get_runtime
from controller.errors import CallTimeoutError

T = TypeVar("T")


class Future(Generic[T]):
    """The pending result of a call: ``await fut`` or ``fut.get(timeout=None)``."""

    __slots__ = ("_factory", "_cf", "_task", "_what", "_outcome")

    def __init__(self, factory: Callable[[], Coroutine[Any, Any, T]], what: str = "call"):
        self._factory = factory
        self._cf: concurrent.futures.Future | None = None
        self._task: asyncio.Future | None = None
        self._what = what
        self._outcome: tuple[bool, Any] | None = None

    def __await__(self) -> Generator[Any, None, T]:
        if self._cf is not None:
            return (yield from asyncio.wrap_future(self._cf).__await__())
        if self._task is not None:
            return (yield from self._task.__await__())
        if self._outcome is not None:  # awaited before: same result again
            ok, value = self._outcome
            if ok:
                return value
            raise value
        # First await: run the call inline in the awaiting task (no extra Task, no extra
        # event-loop iteration on the hot path).
        self._task = _INLINE
        try:
            value = yield from self._factory().__await__()
        except BaseException as e:
            self._outcome = (False, e)
            raise
        finally:
            self._task = None
        self._outcome = (True, value)
        return value

    def _start_background(self) -> concurrent.futures.Future:
        if self._cf is None:
            if self._task is not None or self._outcome is not None:
                raise RuntimeError(f"{self._what} is already being awaited; await it instead")
            rt = get_runtime()
            self._cf = asyncio.run_coroutine_threadsafe(self._factory(), rt.background_loop())
        return self._cf

    def get(self, timeout: float | None = None) -> T:
        """Block until the result is ready. Raises ``CallTimeoutError`` after ``timeout`` s."""
        rt = get_runtime()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is rt._bg_loop:
            raise RuntimeError("Future.get() on the runtime's own loop would deadlock; use await")
        cf = self._start_background()
        try:
            return cf.result(timeout)
        except concurrent.futures.TimeoutError:
            cf.cancel()
            raise CallTimeoutError(f"{self._what} did not finish within {timeout} s") from None

    def start(self) -> Future[T]:
        """Send now (on the running loop if there is one) instead of at first await."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._start_background()
            return self
        if self._task is None and self._cf is None and self._outcome is None:
            self._task = asyncio.ensure_future(self._factory())
        return self


class _Inline:
    """Marker: the future is being awaited inline by some task right now."""

    def __await__(self):
        raise RuntimeError("this call is already being awaited by another task; use .start()")


_INLINE: Any = _Inline()
