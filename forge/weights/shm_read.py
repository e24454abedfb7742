"""Pulling a version from its shared-memory weight file (``forge.weights.shm``): copies out
(``read_shm_file``), read-only views held by a lease (``lease_shm_file``), and the mappings
a process keeps across pulls.

The locking rules that make a recycled file safe to read are in ``forge.weights.shm``'s
docstring; a file another user could have planted is refused here (``check_own``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import threading
import time
import warnings
import weakref
from collections import OrderedDict

import torch

from forge.weights.shm_file import copy_tensor, parse_header, tensor_view
from forge.weights.store import TensorMeta, check_into_keys, checked_destination, dtype_from_name

KEEP_MAPPED = 4  # read-only mappings a puller keeps (keep_last=2 + 1 spare fit with room)


class _Mapping:
    """A read-only, populated mapping of one weight file, kept across pulls."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
        self.mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
        with warnings.catch_warnings():
            # torch warns that the buffer is read-only; these views are only ever read.
            warnings.simplefilter("ignore", UserWarning)
            self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)

    def header(self, path: str) -> tuple[int, dict[str, TensorMeta]]:
        return parse_header(self.mm, path)

    def close(self) -> None:
        del self.u8
        try:
            self.mm.close()
        except BufferError:
            pass  # a view outlived its pull (e.g. held by a traceback); freed with it
        os.close(self.fd)


class _Mappings:
    """This process's kept mappings, by inode; one pull at a time uses them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._by_inode: OrderedDict[tuple[int, int], _Mapping] = OrderedDict()

    def get(self, fd: int) -> tuple[_Mapping, bool]:
        """The mapping of ``fd``'s file and whether it took ownership of ``fd``."""
        for key, m in list(self._by_inode.items()):
            if os.fstat(m.fd).st_nlink == 0:  # unlinked: only this mapping keeps it alive
                self._by_inode.pop(key).close()
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        m = self._by_inode.get(key)
        if m is not None and m.size == st.st_size:
            self._by_inode.move_to_end(key)
            return m, False
        if m is not None:
            self._by_inode.pop(key).close()
        m = self._by_inode[key] = _Mapping(fd, st.st_size)
        while len(self._by_inode) > KEEP_MAPPED:
            self._by_inode.popitem(last=False)[1].close()
        return m, True

    def close(self) -> None:
        while self._by_inode:
            self._by_inode.popitem()[1].close()


_MAPPINGS = _Mappings()


def close_mappings() -> None:
    """Unmap every weight file this process kept mapped (frees files already unlinked)."""
    with _MAPPINGS.lock:
        _MAPPINGS.close()


def gone(version: int, path: str, why: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"weight version {version} is not in shared memory: {path} {why}. It was never "
        "pushed, was dropped by the pusher's retention, or was pushed on another host (use "
        "safetensors_dir there)"
    )


def _open_version(path: str, version: int, wait_s: float) -> int:
    """Open a version's file read-only, waiting up to ``wait_s`` seconds for it to appear;
    ``PermissionError`` unless it is ours (``check_own``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise gone(version, path, f"does not exist (waited {wait_s:g}s)") from None
            time.sleep(0.01)
            continue
        except OSError as e:  # ELOOP: a symbolic link planted under the name
            raise PermissionError(f"{path} is not a regular file ({e.strerror})") from None
        try:
            check_own(os.fstat(fd), path)
        except BaseException:
            os.close(fd)
            raise
        return fd


def is_own(st: os.stat_result) -> bool:
    """A regular file of this process's user that group and others can neither read nor
    write: one Forge wrote (mode 0600), not one another user planted."""
    mode = st.st_mode
    return (
        stat.S_ISREG(mode)
        and st.st_uid == os.geteuid()
        and not mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def check_own(st: os.stat_result, path: str) -> None:
    """``PermissionError`` unless ``is_own(st)``."""
    if not is_own(st):
        raise PermissionError(
            f"{path} is not a weight file of this user (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}): refusing a file another user could have planted"
        )


def _lock_shared(fd: int, version: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise gone(version, path, "is being rewritten with a newer version") from None


class ShmLease:
    """A shared lock on one version's file, held while its tensors are used in place.

    While any lease on a file is held, the pusher never rewrites that file (it writes the
    next version to another one), so the views :func:`lease_shm_file` returned keep their
    values. ``release()`` (idempotent; also at garbage collection) lets the file be recycled:
    call it only once nothing computes with the views any more.
    """

    def __init__(self, fd: int, version: int, path: str) -> None:
        self.version, self.path = version, path
        self._finalizer = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        self._finalizer()  # closing the file releases its lock

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"ShmLease(version={self.version}, {self.path}, {state})"


def lease_shm_file(
    path: str,
    version: int,
    manifest: dict[str, TensorMeta] | None = None,
    wait_s: float = 0.0,
) -> tuple[dict[str, torch.Tensor], ShmLease]:
    """A version's tensors as read-only views of its shm file (no copy), and the lease that
    keeps them valid.

    Every process on the host that leases a version shares one copy of its bytes: a pull is
    a lock and a lookup in this process's kept mappings, not a copy. Writing to a view is a
    segmentation fault (the mapping is read-only): the tensors are for computing with, and
    a newer version replaces them, it is not copied into them. Raises ``FileNotFoundError``
    like :func:`read_shm_file`.
    """
    fd = _open_version(path, version, wait_s)
    try:
        _lock_shared(fd, version, path)
        # A second open file description of the same inode (not dup: a dup would share the
        # lock) for the kept mapping, which may outlive this lease.
        map_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        with _MAPPINGS.lock:
            try:
                mapping, kept = _MAPPINGS.get(map_fd)
            except BaseException:
                os.close(map_fd)
                raise
            if not kept:
                os.close(map_fd)
            found, header_manifest = mapping.header(path)
            if found != version:
                raise gone(version, path, f"now holds version {found}")
            views: dict[TensorMeta, torch.Tensor] = {}
            out = {}
            for name, meta in (manifest or header_manifest).items():
                if meta not in views:
                    views[meta] = tensor_view(mapping.u8, meta, dtype_from_name(meta.dtype))
                out[name] = views[meta]  # tied names share one tensor, as pushed
    except BaseException:
        os.close(fd)
        raise
    return out, ShmLease(fd, version, path)


def read_shm_file(
    path: str,
    version: int,
    manifest: dict[str, TensorMeta] | None = None,
    into: dict[str, torch.Tensor] | None = None,
    wait_s: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Copy a version out of its shm file into ``into`` (returned) or into fresh tensors.

    ``manifest=None`` reads it from the file header. Waits up to ``wait_s`` seconds for the
    file to appear, then raises ``FileNotFoundError`` naming the version and the file (also
    if the file was recycled for a newer version meanwhile).
    """
    fd = _open_version(path, version, wait_s)
    kept = False
    try:
        with _MAPPINGS.lock:
            _lock_shared(fd, version, path)
            try:
                mapping, kept = _MAPPINGS.get(fd)
                found, header_manifest = mapping.header(path)
                if found != version:
                    raise gone(version, path, f"now holds version {found}")
                return _copy_out(mapping.u8, manifest or header_manifest, version, into)
            finally:
                # Explicit: the kept mapping shares this open file, so closing fd would not
                # release the lock.
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        if not kept:
            os.close(fd)


@torch.no_grad()
def _copy_out(
    file_u8: torch.Tensor,
    manifest: dict[str, TensorMeta],
    version: int,
    into: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """One copy per stored tensor out of the mapping (tied names: once per destination)."""
    source = f"weight version {version}"
    if into is None:
        fresh: dict[TensorMeta, torch.Tensor] = {}
        out = {}
        for name, meta in manifest.items():
            if meta not in fresh or not meta.nbytes:
                src = tensor_view(file_u8, meta, dtype_from_name(meta.dtype))
                fresh[meta] = torch.empty(meta.shape, dtype=src.dtype)
                copy_tensor(fresh[meta], src)
            out[name] = fresh[meta]  # tied names stay tied, as in the pusher's state dict
        return out
    check_into_keys(into, list(manifest), source)
    done = set()
    for name, meta in manifest.items():
        dst = into.get(name)
        key = (meta.offset, meta.nbytes, dst.data_ptr() if dst is not None else None)
        if meta.nbytes and key in done:
            continue  # the same bytes into the same memory (the model's tied weights)
        src = tensor_view(file_u8, meta, dtype_from_name(meta.dtype))
        copy_tensor(checked_destination(into, name, src, source), src)
        done.add(key)
    return into
