"""Same-host weight transport: one shared-memory file per version under ``/dev/shm``.

Push copies every tensor once into ``/dev/shm/forge-w-<prefix>-v<version>``; any process on
the host maps that file and copies out of it (into the model's own tensors, or into fresh
ones), so the cost is two memcpys per byte and no pickling. File layout::

    [ b"FORGEW01" | u64 header length | JSON header | pad ] [ tensor 0 | pad ] [ tensor 1 ] ...

Every tensor starts at a 64-byte-aligned offset (cache line; also any dtype's alignment). The
JSON header repeats the manifest so a process that only knows the version can still pull it.
The file is written under a temporary name and hard-linked to its final name only when
complete, so a reader never sees a half-written version.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import time
import weakref
from pathlib import Path

import torch

from forge.weights.store import (
    TensorMeta,
    WeightHandle,
    WeightTransport,
    check_into_keys,
    copy_into,
    dtype_from_name,
    dtype_name,
)

__all__ = ["SharedMemoryTransport", "read_shm_file", "write_shm_file"]

_MAGIC = b"FORGEW01"
_ALIGN = 64
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of ``t``'s data (made contiguous first if it is not)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _plan_layout(
    state_dict: dict[str, torch.Tensor], version: int
) -> tuple[dict[str, TensorMeta], bytes, int]:
    """Manifest with absolute 64-byte-aligned offsets, the encoded file header, file size."""
    rows = [
        [n, dtype_name(t.dtype), list(t.shape), t.numel() * t.element_size()]
        for n, t in state_dict.items()
    ]
    # The header lists the offsets, which depend on the header's size: reserve room for the
    # rows plus up to 24 characters per offset, then lay the tensors out after it.
    data_start = _align(
        16 + len(json.dumps({"version": version, "tensors": rows})) + 24 * len(rows)
    )
    manifest, offset = {}, data_start
    for name, dtype, shape, nbytes in rows:
        manifest[name] = TensorMeta(dtype, tuple(shape), offset, nbytes)
        offset = _align(offset + nbytes)
    table = [[n, m.dtype, list(m.shape), m.offset, m.nbytes] for n, m in manifest.items()]
    header = json.dumps({"version": version, "tensors": table}).encode()
    assert 16 + len(header) <= data_start, "header reserve too small"
    return manifest, _MAGIC + struct.pack("<Q", len(header)) + header, offset


def _advise_huge_pages(mm: mmap.mmap) -> None:
    """Ask for 2 MiB pages: push cost is mostly faulting in fresh tmpfs pages, and huge pages
    cut the faults 512x where the host allows it (shmem_enabled=advise)."""
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass  # Only a performance hint; kernels without THP for shmem refuse it harmlessly.


def write_shm_file(
    path: str, state_dict: dict[str, torch.Tensor], version: int
) -> dict[str, TensorMeta]:
    """Write ``state_dict`` to a new file ``path`` (mode 0600); return the manifest.

    Fails with ``FileExistsError`` if ``path`` exists (``O_EXCL``): files are never reused.
    """
    manifest, header, size = _plan_layout(state_dict, version)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            _advise_huge_pages(mm)
            mm[: len(header)] = header
            file_u8 = torch.frombuffer(mm, dtype=torch.uint8)
            try:
                for name, meta in manifest.items():
                    if meta.nbytes:
                        # One memcpy per tensor (copy_ also reads a CUDA source directly).
                        end = meta.offset + meta.nbytes
                        file_u8[meta.offset : end].copy_(_as_bytes(state_dict[name]))
            finally:
                # The tensor exports mm's buffer; it must die before mm can close.
                del file_u8
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return manifest


def read_shm_file(
    path: str,
    version: int,
    manifest: dict[str, TensorMeta] | None = None,
    into: dict[str, torch.Tensor] | None = None,
    wait_s: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Copy a version out of its shm file into ``into`` (returned) or into fresh tensors.

    ``manifest=None`` reads it from the file header. Waits up to ``wait_s`` seconds for the
    file to appear, then raises ``FileNotFoundError`` naming the version and the file.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
            break
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise FileNotFoundError(
                    f"weight version {version} is not in shared memory: {path} does not exist "
                    f"(waited {wait_s:g}s). It was never pushed, was dropped by the pusher's "
                    "retention, or was pushed on another host (use safetensors_dir there)"
                ) from None
            time.sleep(0.01)
    try:
        if manifest is None:
            manifest = _read_manifest_fd(fd, path)
        out = _read_into(fd, manifest, version, into)
    finally:
        os.close(fd)
    return out


def _read_manifest_fd(fd: int, path: str) -> dict[str, TensorMeta]:
    head = os.pread(fd, 16, 0)
    if head[:8] != _MAGIC:
        raise ValueError(f"{path} is not a Forge weight file (bad magic {head[:8]!r})")
    (length,) = struct.unpack("<Q", head[8:16])
    header = json.loads(os.pread(fd, length, 16))
    return {n: TensorMeta(d, tuple(s), o, b) for n, d, s, o, b in header["tensors"]}


def _pread_exact(fd: int, dst: torch.Tensor, offset: int, nbytes: int) -> None:
    """Read ``nbytes`` at ``offset`` straight into ``dst``'s memory (one copy, no mapping,
    no page faults on the file side)."""
    view = memoryview(dst.reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"short read of weight file at offset {offset + done}")
        done += n


def _read_into(
    fd: int,
    manifest: dict[str, TensorMeta],
    version: int,
    into: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    source = f"weight version {version}"
    if into is not None:
        check_into_keys(into, list(manifest), source)
    out = into if into is not None else {}
    for name, meta in manifest.items():
        dtype = dtype_from_name(meta.dtype)
        dst = into.get(name) if into is not None else None
        direct = (
            dst is not None
            and dst.device.type == "cpu"
            and dst.is_contiguous()
            and dst.dtype == dtype
            and tuple(dst.shape) == tuple(meta.shape)
        )
        if direct:
            _pread_exact(fd, dst, meta.offset, meta.nbytes)
            continue
        fresh = torch.empty(meta.shape, dtype=dtype)
        if meta.nbytes:
            _pread_exact(fd, fresh, meta.offset, meta.nbytes)
        if into is not None:
            copy_into(into, name, fresh, source)  # checks the layout, then copies/casts device
        else:
            out[name] = fresh
    return out


def _unlink_all(paths: set[str]) -> None:
    for path in list(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        paths.discard(path)


class SharedMemoryTransport(WeightTransport):
    """Weights in ``<shm_dir>/forge-w-<prefix>-v<version>``, one file per version.

    Args:
        prefix: names this run's files (letters, digits, ``_.-``); pusher and pullers agree.
        shm_dir: a RAM-backed directory (``/dev/shm`` on Linux).
        wait_s: how long ``pull(version)`` waits for a version's file to appear.

    Files this instance pushed are unlinked by ``drop``/``close``, and at garbage collection
    or interpreter exit as a safety net; a crash (SIGKILL) can still leave them behind.
    """

    name = "shm"

    def __init__(self, prefix: str, shm_dir: str = "/dev/shm", wait_s: float = 0.0) -> None:
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"SharedMemoryTransport prefix {prefix!r} must be non-empty letters, digits, "
                "'_', '.' or '-' (it becomes part of a file name)"
            )
        if not Path(shm_dir).is_dir():
            raise ValueError(f"SharedMemoryTransport shm_dir {shm_dir!r} is not a directory")
        self.prefix = prefix
        self.shm_dir = shm_dir
        self.wait_s = wait_s
        self._owned: set[str] = set()
        self._finalizer = weakref.finalize(self, _unlink_all, self._owned)

    def path(self, version: int) -> str:
        """File holding ``version``."""
        return os.path.join(self.shm_dir, f"forge-w-{self.prefix}-v{int(version)}")

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        final = self.path(version)
        if os.path.exists(final):
            raise ValueError(f"weight version {version} already exists at {final}; drop it first")
        tmp = f"{final}.tmp-{os.getpid()}-{id(self)}"
        manifest = write_shm_file(tmp, state_dict, version)
        try:
            # link() never replaces an existing name: an atomic, no-clobber publish.
            os.link(tmp, final)
        except FileExistsError:
            raise ValueError(
                f"weight version {version} was pushed concurrently by another process ({final})"
            ) from None
        finally:
            os.unlink(tmp)
        self._owned.add(final)
        return WeightHandle(version, self.name, final, manifest)

    def pull(
        self,
        handle_or_version: WeightHandle | int,
        into: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        if isinstance(handle_or_version, WeightHandle):
            h = handle_or_version
            return read_shm_file(h.location, h.version, h.manifest, into, self.wait_s)
        version = int(handle_or_version)
        return read_shm_file(self.path(version), version, None, into, self.wait_s)

    def drop(self, version: int) -> None:
        path = self.path(version)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self._owned.discard(path)

    def versions(self) -> list[int]:
        pattern = re.compile(rf"^forge-w-{re.escape(self.prefix)}-v(\d+)$")
        found = (pattern.match(name) for name in os.listdir(self.shm_dir))
        return sorted(int(m.group(1)) for m in found if m)

    def close(self) -> None:
        _unlink_all(self._owned)
