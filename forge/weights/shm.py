"""Same-host weight transport: one shared-memory file per version under ``/dev/shm``.

Push copies every tensor once into ``/dev/shm/forge-w-<prefix>-v<version>-<random>``; any
process on the host maps that file and copies out of it (into the model's own tensors, or into fresh
ones), so the cost is two memcpys per byte and no pickling. File layout::

    [ b"FORGEW01" | u64 header length | JSON header | pad ] [ tensor 0 | pad ] [ tensor 1 ] ...

Every tensor starts at a 64-byte-aligned offset (cache line; also any dtype's alignment).
Tensors that share their bytes (tied embeddings: ``lm_head.weight`` is
``model.embed_tokens.weight``) are stored once; their manifest entries share one offset. The
JSON header repeats the manifest so a process that only knows the version can still pull it.
A new file is written under a temporary name and hard-linked to its final name only when
complete, so a reader never sees a half-written version.

Another user of the host. ``/dev/shm`` is shared: every name in it ends in 64 random bits, so
no one can plant a file where a push will create one (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
0600), and a puller opens a version only if the file is a regular file owned by its own user
and not open to group or others (a file planted under a matching name is skipped by
``versions`` and refused by name, ``PermissionError``).

Warm files on both sides. Most of a copy into a *fresh* tmpfs file, or out of a *fresh*
mapping, is page faults, not bytes. So:

* the pusher keeps the files it wrote mapped, and when retention drops a version it renames
  the file to a spare (``forge-w-<prefix>-spare-...``) instead of unlinking it; the next push
  rewrites a spare of the right size through its already-populated mapping (a memcpy);
* a puller keeps up to :data:`KEEP_MAPPED` read-only mappings per process, keyed by the file's
  inode, so pulling a recycled file again copies through populated page tables.

The invariant that makes recycling safe: **a file is only written while no version name
links to it and the writer holds an exclusive ``flock`` on it; a reader copies only while
holding a shared ``flock`` and after checking that the header names the version it asked
for.** A spare is taken only if its exclusive lock is free (a late reader of the dropped
version still holds its shared lock: the pusher then leaves that spare alone and writes a
fresh file); the writer puts the new header in first, so a reader that opened the file under
its old name and locks it afterwards sees another version number and reports the version as
dropped, never mixes two versions. Files are never resized, so a kept mapping never reaches
past the end of its file. A kept mapping holds its file's memory until the next pull in that
process notices the file was unlinked, or :func:`close_mappings`, or the process exits.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import re
import secrets
import stat
import struct
import threading
import time
import uuid
import warnings
import weakref
from collections import OrderedDict
from pathlib import Path

import torch

from controller import files
from controller._serialization import shm_prefix
from forge.weights.store import (
    TensorMeta,
    WeightHandle,
    WeightTransport,
    check_into_keys,
    checked_destination,
    dtype_from_name,
    dtype_name,
)

__all__ = [
    "KEEP_MAPPED",
    "SharedMemoryTransport",
    "ShmLease",
    "close_mappings",
    "lease_shm_file",
    "read_shm_file",
    "write_shm_file",
]

_MAGIC = b"FORGEW01"
_ALIGN = 64
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
KEEP_MAPPED = 4  # read-only mappings a puller keeps (keep_last=2 + 1 spare fit with room)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _alias_key(t: torch.Tensor) -> tuple | None:
    """Equal keys mean the same bytes (tied weights); ``None`` for empty tensors."""
    if t.numel() == 0:
        return None
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def _plan_layout(
    state_dict: dict[str, torch.Tensor], version: int
) -> tuple[dict[str, TensorMeta], bytes, int]:
    """Manifest with absolute 64-byte-aligned offsets, the encoded file header, file size."""
    first: dict[tuple, str] = {}
    rows = []
    for n, t in state_dict.items():
        key = _alias_key(t)
        same_as = first.setdefault(key, n) if key is not None else n
        rows.append([n, dtype_name(t.dtype), list(t.shape), t.numel() * t.element_size(), same_as])
    # The header lists the offsets, which depend on the header's size: reserve room for the
    # rows plus up to 24 characters per offset, then lay the tensors out after it.
    data_start = _align(
        16 + len(json.dumps({"version": version, "tensors": rows})) + 24 * len(rows)
    )
    manifest: dict[str, TensorMeta] = {}
    offset = data_start
    for name, dtype, shape, nbytes, same_as in rows:
        if same_as != name:
            manifest[name] = manifest[same_as]
            continue
        manifest[name] = TensorMeta(dtype, tuple(shape), offset, nbytes)
        offset = _align(offset + nbytes)
    table = [[n, m.dtype, list(m.shape), m.offset, m.nbytes] for n, m in manifest.items()]
    header = json.dumps({"version": version, "tensors": table}).encode()
    assert 16 + len(header) <= data_start, "header reserve too small"
    return manifest, _MAGIC + struct.pack("<Q", len(header)) + header, offset


def _view(file_u8: torch.Tensor, meta: TensorMeta, dtype: torch.dtype) -> torch.Tensor:
    """The tensor ``meta`` describes, as a view of the mapped file (no copy)."""
    return file_u8[meta.offset : meta.offset + meta.nbytes].view(dtype).view(meta.shape)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (same dtype and shape); one single-threaded ``memmove`` when both are
    contiguous CPU tensors. A copy is memory-bound, so intra-op threads add little, and on a
    busy host oversubscribed OpenMP threads made ``copy_`` 3x slower than one thread (see the
    weight sync runs moved from docs/benchmarks.md to docs/devlog.md)."""
    cpu = dst.device.type == "cpu" and src.device.type == "cpu"
    if cpu and dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype:
        if src.numel():
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
    else:
        dst.copy_(src)


class _Segment:
    """A file this process writes, mapped once and kept mapped while the file exists, so a
    recycled file is rewritten through page tables that are already populated."""

    def __init__(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_RDWR, 0o600)
        try:
            # Allocate every page in one call: running out of /dev/shm is an OSError here,
            # not a SIGBUS in the middle of the copy, and no page is faulted in one by one.
            os.posix_fallocate(fd, 0, size)
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        self.fd, self.path, self.size = fd, path, size
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)

    def try_lock(self) -> bool:
        """Take the exclusive lock unless a reader holds a shared one."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    @torch.no_grad()
    def write(self, header: bytes, manifest: dict[str, TensorMeta], state_dict) -> None:
        # Header first: a reader of this file's previous version now sees another version.
        self.mm[: len(header)] = header
        written = set()
        for name, meta in manifest.items():
            if meta.nbytes and meta.offset not in written:
                # One copy per tensor, straight from the source (strided or CUDA) into place.
                t = state_dict[name].detach()
                _copy(_view(self.u8, meta, t.dtype), t)
                written.add(meta.offset)

    def close(self, unlink: bool) -> None:
        del self.u8  # the tensor exports mm's buffer; it must die before mm can close
        self.mm.close()
        os.close(self.fd)
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def write_shm_file(
    path: str, state_dict: dict[str, torch.Tensor], version: int
) -> dict[str, TensorMeta]:
    """Write ``state_dict`` to a new file ``path`` (mode 0600); return the manifest.

    Fails with ``FileExistsError`` if ``path`` exists (``O_EXCL``).
    """
    manifest, header, size = _plan_layout(state_dict, version)
    seg = _Segment(path, size)
    try:
        seg.write(header, manifest, state_dict)
    except BaseException:
        seg.close(unlink=True)
        raise
    seg.close(unlink=False)
    return manifest


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
        if self.mm[:8] != _MAGIC:
            raise ValueError(f"{path} is not a Forge weight file (bad magic {self.mm[:8]!r})")
        (length,) = struct.unpack("<Q", self.mm[8:16])
        header = json.loads(self.mm[16 : 16 + length])
        table = header["tensors"]
        return header["version"], {n: TensorMeta(d, tuple(s), o, b) for n, d, s, o, b in table}

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


def _gone(version: int, path: str, why: str) -> FileNotFoundError:
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
                raise _gone(version, path, f"does not exist (waited {wait_s:g}s)") from None
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
        raise _gone(version, path, "is being rewritten with a newer version") from None


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
                raise _gone(version, path, f"now holds version {found}")
            views: dict[TensorMeta, torch.Tensor] = {}
            out = {}
            for name, meta in (manifest or header_manifest).items():
                if meta not in views:
                    views[meta] = _view(mapping.u8, meta, dtype_from_name(meta.dtype))
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
                    raise _gone(version, path, f"now holds version {found}")
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
                src = _view(file_u8, meta, dtype_from_name(meta.dtype))
                fresh[meta] = torch.empty(meta.shape, dtype=src.dtype)
                _copy(fresh[meta], src)
            out[name] = fresh[meta]  # tied names stay tied, as in the pusher's state dict
        return out
    check_into_keys(into, list(manifest), source)
    done = set()
    for name, meta in manifest.items():
        dst = into.get(name)
        key = (meta.offset, meta.nbytes, dst.data_ptr() if dst is not None else None)
        if meta.nbytes and key in done:
            continue  # the same bytes into the same memory (the model's tied weights)
        src = _view(file_u8, meta, dtype_from_name(meta.dtype))
        _copy(checked_destination(into, name, src, source), src)
        done.add(key)
    return into


def _session_suffix(prefix: str) -> str:
    """``.<session tag>`` unless ``prefix`` already holds the tag: a file of a session killed
    before it could remove it (SIGKILL) is then removed by the next session's sweep
    (``controller._runtime``), whatever prefix it was pushed under."""
    tag = shm_prefix()
    return "" if tag in prefix else f".{tag}"


def _close_all(live: dict[int, _Segment], spares: list[_Segment]) -> None:
    for seg in [*live.values(), *spares]:
        seg.close(unlink=True)
    live.clear()
    spares.clear()


class SharedMemoryTransport(WeightTransport):
    """Weights in ``<shm_dir>/forge-w-<prefix>-v<version>-<random>``, one file per version.

    Args:
        prefix: names this run's files (letters, digits, ``_.-``); pusher and pullers agree.
        shm_dir: a RAM-backed directory (``/dev/shm`` on Linux).
        wait_s: how long ``pull(version)`` waits for a version's file to appear.
        spares: files of dropped versions kept (renamed, still mapped) for later pushes to
            rewrite instead of faulting in new pages; each holds one version's bytes of
            memory. ``0`` unlinks dropped versions at once.

    Files this instance pushed are unlinked by ``close``, and at garbage collection or
    interpreter exit as a safety net; a crash (SIGKILL) can still leave them behind.
    """

    name = "shm"

    def __init__(
        self, prefix: str, shm_dir: str = "/dev/shm", wait_s: float = 0.0, spares: int = 1
    ) -> None:
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"SharedMemoryTransport prefix {prefix!r} must be non-empty letters, digits, "
                "'_', '.' or '-' (it becomes part of a file name)"
            )
        if not Path(shm_dir).is_dir():
            raise ValueError(f"SharedMemoryTransport shm_dir {shm_dir!r} is not a directory")
        if not isinstance(spares, int) or spares < 0:
            raise ValueError(f"SharedMemoryTransport spares must be an int >= 0, got {spares!r}")
        self.prefix = prefix
        self.shm_dir = shm_dir
        self.wait_s = wait_s
        self.spares = spares
        self._live: dict[int, _Segment] = {}  # versions this instance pushed
        self._spares: list[_Segment] = []
        self._renames = 0
        self._finalizer = weakref.finalize(self, _close_all, self._live, self._spares)

    def path(self, version: int) -> str:
        """File holding ``version`` (one of this user's); where there is none, the glob
        pattern of its name (``...-v<version>-*``), which names no file."""
        found = self._find(int(version))
        return self._pattern(int(version)) if found is None else found

    def _pattern(self, version: int) -> str:
        return os.path.join(self.shm_dir, f"forge-w-{self.prefix}-v{version}-*")

    def _names(self) -> dict[int, str]:
        """{version: path} of this user's version files with this prefix."""
        pattern = re.compile(
            rf"^forge-w-{re.escape(self.prefix)}-v(\d+)-[0-9a-f]{{16}}(?:\.forge-[0-9a-z_-]+)?$"
        )
        out = {}
        for name in os.listdir(self.shm_dir):
            m = pattern.match(name)
            if m is None:
                continue
            path = os.path.join(self.shm_dir, name)
            try:
                if is_own(os.lstat(path)):  # planted files (another owner, a link) are skipped
                    out[int(m.group(1))] = path
            except FileNotFoundError:
                pass
        return out

    def _find(self, version: int) -> str | None:
        seg = self._live.get(version)
        return seg.path if seg is not None else self._names().get(version)

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        if self._find(int(version)) is not None:
            where = self._find(int(version))
            raise ValueError(f"weight version {version} already exists at {where}; drop it first")
        name = f"forge-w-{self.prefix}-v{int(version)}-{secrets.token_hex(8)}"
        final = os.path.join(self.shm_dir, name + _session_suffix(self.prefix))
        manifest, header, size = _plan_layout(state_dict, version)
        seg = self._take_spare(size)  # locked exclusively: no reader is in it
        if seg is None:
            seg = _Segment(self._unique_name("tmp"), size)
        try:
            seg.write(header, manifest, state_dict)
            seg.unlock()  # no-op for a new file, which nobody could lock
            # link() never replaces an existing name: an atomic, no-clobber publish.
            os.link(seg.path, final)
        except BaseException as e:
            seg.close(unlink=True)
            if isinstance(e, FileExistsError):
                raise ValueError(
                    f"weight version {version} was pushed concurrently by another process ({final})"
                ) from None
            raise
        os.unlink(seg.path)
        seg.path = final
        self._live[int(version)] = seg
        files.publish(final)  # pullers on other hosts copy it through this process
        source = files.own_address()
        return WeightHandle(version, self.name, final, manifest, source, uuid.uuid4().hex[:12])

    def _unique_name(self, kind: str) -> str:
        self._renames += 1
        name = f"forge-w-{self.prefix}-{kind}-{os.getpid()}-{self._renames}-{secrets.token_hex(8)}"
        name += _session_suffix(self.prefix)
        return os.path.join(self.shm_dir, name)

    def _take_spare(self, size: int) -> _Segment | None:
        """A spare of ``size`` bytes that no reader holds, exclusively locked; else None."""
        for seg in list(self._spares):
            if seg.size != size:  # the state dict changed shape: this file will not fit
                self._spares.remove(seg)
                seg.close(unlink=True)
            elif seg.try_lock():
                self._spares.remove(seg)
                return seg
        return None

    def pull(
        self,
        handle_or_version: WeightHandle | int,
        into: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        if isinstance(handle_or_version, WeightHandle):
            h = handle_or_version
            return read_shm_file(h.location, h.version, h.manifest, into, self.wait_s)
        version = int(handle_or_version)
        deadline = time.monotonic() + self.wait_s
        while (path := self._find(version)) is None:
            if time.monotonic() >= deadline:
                raise _gone(version, self._pattern(version), f"does not exist (waited "
                            f"{self.wait_s:g}s)")  # fmt: skip
            time.sleep(0.01)
        return read_shm_file(path, version, None, into, 0.0)

    def drop(self, version: int) -> None:
        """Remove ``version``'s name; a file this instance pushed becomes a spare (while
        fewer than ``spares`` are kept), else it is unlinked."""
        seg = self._live.pop(int(version), None)
        if seg is None:
            path = self._names().get(int(version))
            if path is not None:
                files.unpublish(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            return
        files.unpublish(seg.path)
        if len(self._spares) >= self.spares:
            seg.close(unlink=True)
            return
        spare = self._unique_name("spare")
        try:
            os.rename(seg.path, spare)  # atomic: new opens of the version fail from here on
        except FileNotFoundError:  # someone else removed it; nothing to keep
            seg.close(unlink=False)
            return
        seg.path = spare
        self._spares.append(seg)

    def versions(self) -> list[int]:
        return sorted(self._names())

    def close(self) -> None:
        _close_all(self._live, self._spares)
