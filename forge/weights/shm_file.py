"""The weight file's format: layout, writing, and reading its header (``forge.weights.shm``).

File layout::

    [ b"FORGEW01" | u64 header length | JSON header | pad ] [ tensor 0 | pad ] [ tensor 1 ] ...

Every tensor starts at a 64-byte-aligned offset (cache line; also any dtype's alignment).
Tensors that share their bytes (tied embeddings: ``lm_head.weight`` is
``model.embed_tokens.weight``) are stored once; their manifest entries share one offset. The
JSON header repeats the manifest so a process that only knows the version can still pull it.
A new file is written under a temporary name and hard-linked to its final name only when
complete (``SharedMemoryTransport.push``), so a reader never sees a half-written version.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import struct

import torch

from forge.weights.store import TensorMeta, dtype_name

MAGIC = b"FORGEW01"
ALIGN = 64


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _alias_key(t: torch.Tensor) -> tuple | None:
    """Equal keys mean the same bytes (tied weights); ``None`` for empty tensors."""
    if t.numel() == 0:
        return None
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def plan_layout(
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
    data_start = align(16 + len(json.dumps({"version": version, "tensors": rows})) + 24 * len(rows))
    manifest: dict[str, TensorMeta] = {}
    offset = data_start
    for name, dtype, shape, nbytes, same_as in rows:
        if same_as != name:
            manifest[name] = manifest[same_as]
            continue
        manifest[name] = TensorMeta(dtype, tuple(shape), offset, nbytes)
        offset = align(offset + nbytes)
    table = [[n, m.dtype, list(m.shape), m.offset, m.nbytes] for n, m in manifest.items()]
    header = json.dumps({"version": version, "tensors": table}).encode()
    assert 16 + len(header) <= data_start, "header reserve too small"
    return manifest, MAGIC + struct.pack("<Q", len(header)) + header, offset


def tensor_view(file_u8: torch.Tensor, meta: TensorMeta, dtype: torch.dtype) -> torch.Tensor:
    """The tensor ``meta`` describes, as a view of the mapped file (no copy)."""
    return file_u8[meta.offset : meta.offset + meta.nbytes].view(dtype).view(meta.shape)


def copy_tensor(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (same dtype and shape); one single-threaded ``memmove`` when both are
    contiguous CPU tensors. A copy is memory-bound, so intra-op threads add little, and on a
    busy host oversubscribed OpenMP threads make ``copy_`` slower than one thread (the weight
    sync runs in docs/devlog.md)."""
    cpu = dst.device.type == "cpu" and src.device.type == "cpu"
    if cpu and dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype:
        if src.numel():
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
    else:
        dst.copy_(src)


class Segment:
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
                copy_tensor(tensor_view(self.u8, meta, t.dtype), t)
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
    manifest, header, size = plan_layout(state_dict, version)
    seg = Segment(path, size)
    try:
        seg.write(header, manifest, state_dict)
    except BaseException:
        seg.close(unlink=True)
        raise
    seg.close(unlink=False)
    return manifest


def parse_header(buf, path: str) -> tuple[int, dict[str, TensorMeta]]:
    """The version and manifest in the header of a weight file's bytes ``buf`` (a mapping);
    ``ValueError`` if it is not a Forge weight file."""
    if buf[:8] != MAGIC:
        raise ValueError(f"{path} is not a Forge weight file (bad magic {buf[:8]!r})")
    (length,) = struct.unpack("<Q", buf[8:16])
    header = json.loads(buf[16 : 16 + length])
    table = header["tensors"]
    return header["version"], {n: TensorMeta(d, tuple(s), o, b) for n, d, s, o, b in table}
