"""The files a worker process serves to its session's peers on other hosts (``READ`` frames):
only those it published (``publish``), e.g. a pushed weight version. ``controller.files`` is
the API; this registry is apart so that the worker loop reads it without importing that."""

from __future__ import annotations

import os

_published: set[str] = set()


def publish(path: str) -> None:
    """Let the session's processes read ``path`` of this process's host through this process
    (``controller.files.fetch_published``); e.g. a pushed weight version, for a puller on
    another host."""
    _published.add(os.path.abspath(path))


def unpublish(path: str) -> None:
    """Stop serving ``path`` (it is being dropped)."""
    _published.discard(os.path.abspath(path))


def read_published(path: str, offset: int, size: int) -> bytes | int:
    """What a ``READ`` frame asks of this worker: ``size`` bytes of a published file from
    ``offset``, or its size when ``size`` is negative."""
    if os.path.abspath(path) not in _published:
        raise PermissionError(f"{path} is not published by process {os.getpid()}")
    if size < 0:
        return os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)
