"""Durable writes for checkpoints: a file or directory is written under a temporary name,
flushed to disk (``fsync`` of every file and directory), then published by one rename, so
that a reader, a crash or a full disk at any point finds either the old version or the new
one, whole, never a mix or a torn file.

    write_file(run_dir / "latest", b"...")    # file.tmp, fsync, rename, fsync the directory
    publish_dir(tmp_dir, final_dir)           # fsync the tree, rename (or swap), fsync parent

An existing ``final_dir`` is swapped with the new one in one step (Linux ``renameat2``
``RENAME_EXCHANGE``) and then removed; where the kernel or filesystem cannot swap, it is
moved aside first, which leaves a moment without either.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

__all__ = ["fsync_path", "fsync_tree", "publish_dir", "write_file"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """``fsync_path`` on every file and directory under ``root`` (links not followed), each
    directory after what it holds, ``root`` last."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fsync_path(path)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fsync_path(path)
    fsync_path(root)


def write_file(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (``<path>.tmp`` first)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def publish_dir(tmp: str | Path, final: str | Path) -> None:
    """Make the directory ``tmp`` (written in full) appear as ``final`` in one step, after
    flushing it to disk; an existing ``final`` is replaced and removed."""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    if not final.exists():
        os.rename(tmp, final)
    elif _exchange(tmp, final):
        fsync_path(final.parent)
        shutil.rmtree(tmp)  # now the old version
    else:  # no atomic swap here: the old version moves aside first
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(tmp, final)
        fsync_path(final.parent)
        shutil.rmtree(aside)
    fsync_path(final.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))
