"""The files a worker process serves to its session's peers on other hosts (``READ`` frames):
only those it published (``publish``), e.g. a pushed weight version. ``controller.files`` is
the API; this registry is apart so that the worker loop reads it without importing that.

A file may also be published while it is still being written (``publish_growing``): a host
that relays a copy to the next host serves the bytes it has before it has them all. A read of
a range not written yet waits for it (``wait_readable``, polled, bounded); once the writer has
renamed the file into place it is served like any other.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

_published: set[str] = set()
_growing: dict[str, Growing] = {}
_served: dict[str, int] = {}  # bytes read by peers, per published path
_lock = threading.Lock()  # the writer may run on another thread than the worker loop
POLL_S = 0.005


class Growing:
    """A file being written at ``tmp`` that will be renamed to its published ``path``; the
    writer reports its size, each written range, and the end (``done``) or a failure."""

    def __init__(self, path: str, tmp: str):
        self.path, self.tmp = path, tmp
        self.size: int | None = None
        self.ready = 0  # bytes written from offset 0 without a gap
        self._pending: dict[int, int] = {}  # offset -> end of ranges written past a gap
        self.failed: str | None = None
        self.done = False

    def set_size(self, size: int) -> None:
        self.size = size

    def wrote(self, offset: int, size: int) -> None:
        """The range ``[offset, offset + size)`` is written."""
        with _lock:
            self._pending[offset] = offset + size
            while self.ready in self._pending:
                self.ready = self._pending.pop(self.ready)

    def finish(self) -> None:
        """Rename the written file into place and serve it as a plain published file."""
        with _lock:
            os.replace(self.tmp, self.path)
            self.done = True
            _published.add(self.path)
            _growing.pop(self.path, None)

    def fail(self, why: str) -> None:
        """The copy was given up: readers waiting on it get an error naming ``why``."""
        with _lock:
            self.failed = why
            _growing.pop(self.path, None)

    def _readable(self, offset: int, size: int) -> bool:
        if self.done or self.failed:
            return True
        if self.size is None:
            return False
        return size < 0 or self.ready >= min(offset + size, self.size)


def publish(path: str) -> None:
    """Let the session's processes read ``path`` of this process's host through this process
    (``controller.files.fetch_published``); e.g. a pushed weight version, for a puller on
    another host."""
    _published.add(os.path.abspath(path))


def publish_growing(path: str, tmp: str) -> Growing:
    """Publish ``path`` while it is being written at ``tmp`` (see module doc); the caller
    reports progress on the returned ``Growing`` and ends with ``finish`` or ``fail``."""
    g = Growing(os.path.abspath(path), tmp)
    with _lock:
        _growing[g.path] = g
    return g


def unpublish(path: str) -> None:
    """Stop serving ``path`` (it is being dropped)."""
    _published.discard(os.path.abspath(path))
    _served.pop(os.path.abspath(path), None)


def served_bytes(path: str) -> int:
    """Bytes of ``path`` this process has served to peers so far."""
    return _served.get(os.path.abspath(path), 0)


async def wait_readable(path: str, offset: int, size: int, timeout: float) -> None:
    """Return once ``read_published(path, offset, size)`` will not wait for a writer (at once
    for a file that is not growing). Raises ``TimeoutError`` after ``timeout`` seconds."""
    g = _growing.get(os.path.abspath(path))
    if g is None:
        return
    deadline = time.monotonic() + timeout
    while not g._readable(offset, size):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{path}: bytes {offset}..{offset + size} not written within {timeout:.0f} s "
                f"(this host's copy stalled at {g.ready} of {g.size} bytes)"
            )
        await asyncio.sleep(POLL_S)


def read_published(path: str, offset: int, size: int) -> bytes | int:
    """What a ``READ`` frame asks of this worker: ``size`` bytes of a published file from
    ``offset``, or its size when ``size`` is negative."""
    path = os.path.abspath(path)
    with _lock:
        g = _growing.get(path)
        if g is None and path not in _published:
            raise PermissionError(f"{path} is not published by process {os.getpid()}")
        if g is not None and g.failed:
            raise OSError(f"{path}: this host's copy failed: {g.failed}")
        if g is not None and size < 0:
            if g.size is None:
                raise OSError(f"{path}: its size is not known yet")
            return g.size
        if g is not None and not g._readable(offset, size):
            raise OSError(f"{path}: bytes {offset}..{offset + size} are not written yet")
        f = open(g.tmp if g is not None else path, "rb")  # noqa: SIM115 - opened under the lock
    with f:
        if size < 0:
            return os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(size)
    with _lock:
        _served[path] = _served.get(path, 0) + len(data)
    return data
