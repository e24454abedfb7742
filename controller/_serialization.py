"""Message serialization: cloudpickle, with large tensors and arrays moved through shared memory.

Closures, lambdas and locally defined classes travel by value (cloudpickle). A torch tensor
or numpy array of at least ``SHM_THRESHOLD`` bytes is not copied into the byte stream: the
sender copies it into a shared-memory segment and pickles a reference, and ownership of the
segment moves with the message. The receiver maps the segment and its tensor *is* that
memory (no second copy); the sender never touches it again, so nothing is aliased. When the
receiver's tensor is freed, the segment joins that process's pool of warm segments for its
own sends, so a steady exchange costs one memcpy per direction and no page faults.

If /dev/shm lacks space, the payload travels in-band instead (slower, still correct).
Segment files are named ``forge-<root pid>-<session>-...``; the root controller removes any
left when the session ends (e.g. in flight to a process that died).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import threading
import uuid
import weakref
from typing import Any

import cloudpickle

from controller import env_vars

SHM_THRESHOLD = 64 * 1024
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
_HEADER = 64  # payload offset (keeps the data 64-byte aligned)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

_shm_prefix = f"forge-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def set_shm_prefix(prefix: str) -> None:
    """Name shared-memory files after the root session, so its shutdown can sweep them."""
    global _shm_prefix
    _shm_prefix = prefix


def shm_prefix() -> str:
    return _shm_prefix


class _Segment:
    __slots__ = ("path", "mm", "size", "__weakref__")

    def __init__(self, path: str, mm: mmap.mmap, size: int):
        self.path, self.mm, self.size = path, mm, size

    @classmethod
    def create(cls, size: int) -> _Segment | None:
        """A new segment, or None if /dev/shm has no room (the caller sends in-band)."""
        path = os.path.join(SHM_DIR, f"{_shm_prefix}-{uuid.uuid4().hex}")  # pyright: ignore[reportCallIssue, reportArgumentType]  # callers check SHM_DIR
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # fallocate, not ftruncate: a full tmpfs must fail here, not SIGBUS on first touch.
            os.posix_fallocate(fd, 0, _HEADER + size)
            mm = mmap.mmap(fd, _HEADER + size, flags=mmap.MAP_SHARED | _MAP_POPULATE)
        except OSError:
            os.unlink(path)
            return None
        finally:
            os.close(fd)
        return cls(path, mm, size)

    @classmethod
    def open(cls, path: str, size: int) -> _Segment:
        cached = _mapped.pop(path)
        if cached is not None and cached.size >= size:
            return cached
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise RuntimeError(
                f"shared-memory payload {path} is gone: the session ended before the message "
                "was read"
            ) from None
        try:
            full = os.fstat(fd).st_size
            mm = mmap.mmap(fd, full, flags=mmap.MAP_SHARED | _MAP_POPULATE)
        finally:
            os.close(fd)
        return cls(path, mm, full - _HEADER)

    def unmap(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            self.mm.close()
        except BufferError:  # still exported by a live tensor; the mapping dies with it
            pass


class _Pool:
    """Warm segments this process owns and may send (bounded by ``FORGE_SHM_POOL_BYTES``)."""

    def __init__(self):
        self.lock = threading.RLock()  # RLock: a GC finalizer may give back while we hold it
        self.free: list[_Segment] = []

    def take(self, nbytes: int) -> _Segment | None:
        with self.lock:
            best = None
            for seg in self.free:
                if nbytes <= seg.size <= 2 * nbytes + (1 << 20):
                    if best is None or seg.size < best.size:
                        best = seg
            if best is not None:
                self.free.remove(best)
                return best
        return _Segment.create(max(nbytes, SHM_THRESHOLD))

    def give(self, seg: _Segment) -> None:
        with self.lock:
            self.free.append(seg)
            total, cap = sum(s.size for s in self.free), env_vars.shm_pool_bytes()
            while total > cap and self.free:
                old = self.free.pop(0)
                total -= old.size
                old.close()

    def close(self) -> None:
        with self.lock:
            for seg in self.free:
                seg.close()
            self.free.clear()


class _MappedCache:
    """Mappings of segments this process has sent away. A segment often comes back (two
    processes trading tensors), and re-mapping a large one costs page-table work; the mapping is never
    written while another process owns the segment. Bounded by ``FORGE_SHM_POOL_BYTES``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.segs: dict[str, _Segment] = {}

    def put(self, seg: _Segment) -> None:
        with self.lock:
            self.segs[seg.path] = seg
            total, cap = sum(s.size for s in self.segs.values()), env_vars.shm_pool_bytes()
            while total > cap:
                old = self.segs.pop(next(iter(self.segs)))
                total -= old.size
                old.unmap()

    def pop(self, path: str) -> _Segment | None:
        with self.lock:
            return self.segs.pop(path, None)

    def close(self) -> None:
        with self.lock:
            for seg in self.segs.values():
                seg.unmap()
            self.segs.clear()


_pool = _Pool()
_mapped = _MappedCache()


def close_pool() -> None:
    _pool.close()
    _mapped.close()


def _adopt(path: str, nbytes: int):
    """Map a received segment as a uint8 ndarray; when the last tensor or array using it is
    freed, the segment returns to this process's pool."""
    import numpy as np

    seg = _Segment.open(path, nbytes)
    arr = np.frombuffer(seg.mm, dtype=np.uint8, count=nbytes, offset=_HEADER)
    weakref.finalize(arr, _pool.give, seg)
    return arr


def _rebuild_tensor(path, nbytes, dtype_name, shape, device, requires_grad):
    import torch

    dtype = getattr(torch, dtype_name)
    t = torch.from_numpy(_adopt(path, nbytes)).view(dtype).view(shape)
    if device != "cpu":
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_array(path, nbytes, dtype_str, shape):
    import numpy as np

    return _adopt(path, nbytes).view(np.dtype(dtype_str)).reshape(shape)


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file, use_shm: bool):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.use_shm = use_shm and SHM_DIR is not None
        self.segments: list[_Segment] = []

    def reducer_override(self, obj):
        if self.use_shm:
            t = type(obj)
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, torch.Tensor) and t in _tensor_types(torch):
                if (
                    obj.numel() * obj.element_size() >= SHM_THRESHOLD
                    and obj.layout == torch.strided
                ):
                    return self._reduce_tensor(obj, torch)
            np = sys.modules.get("numpy")
            if np is not None and t is np.ndarray and obj.nbytes >= SHM_THRESHOLD:
                if obj.dtype.kind not in "OV":
                    return self._reduce_array(obj, np)
        return super().reducer_override(obj)

    def _reduce_tensor(self, obj, torch):
        src = obj.detach()
        device = str(src.device)
        if src.device.type != "cpu":
            src = src.cpu()
        src = src.contiguous()
        nbytes = src.numel() * src.element_size()
        seg = _pool.take(nbytes)
        if seg is None:
            return super().reducer_override(obj)
        self.segments.append(seg)
        dst = torch.frombuffer(seg.mm, dtype=torch.uint8, count=nbytes, offset=_HEADER)
        dst.copy_(src.reshape(-1).view(torch.uint8))
        del dst
        dtype_name = str(src.dtype).removeprefix("torch.")
        args = (seg.path, nbytes, dtype_name, tuple(src.shape), device, obj.requires_grad)
        return _rebuild_tensor, args

    def _reduce_array(self, obj, np):
        src = np.ascontiguousarray(obj)
        seg = _pool.take(src.nbytes)
        if seg is None:
            return super().reducer_override(obj)
        self.segments.append(seg)
        dst = np.frombuffer(seg.mm, dtype=np.uint8, count=src.nbytes, offset=_HEADER)
        dst[:] = src.reshape(-1).view(np.uint8)
        del dst
        return _rebuild_array, (seg.path, src.nbytes, src.dtype.str, src.shape)


_TENSOR_TYPES: tuple | None = None


def _tensor_types(torch) -> tuple:
    global _TENSOR_TYPES
    if _TENSOR_TYPES is None:
        _TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
    return _TENSOR_TYPES


_PLAIN = (type(None), bool, int, float, str, bytes)


def _is_plain(obj, depth: int = 0) -> bool:
    t = type(obj)
    if t in _PLAIN:
        return True
    if depth > 2:
        return False
    if t is tuple or t is list:
        return len(obj) <= 16 and all(_is_plain(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 16 and all(
            type(k) is str and _is_plain(v, depth + 1) for k, v in obj.items()
        )
    return False


def dumps(obj, use_shm: bool = True) -> tuple[bytes, list]:
    """Serialize ``obj``; returns the bytes and the shared-memory files it created.

    Small messages of plain data take the C pickler directly (the hot path of a call);
    everything else goes through cloudpickle. If pickling fails, any shared-memory files
    already written are removed.
    """
    if _is_plain(obj):
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), []
    buf = io.BytesIO()
    p = _Pickler(buf, use_shm)
    try:
        p.dump(obj)
    except BaseException:
        discard_shm(p.segments)
        raise
    for seg in p.segments:  # ownership moves with the message: we never write these again
        _mapped.put(seg)
    return buf.getvalue(), [seg.path for seg in p.segments]


def loads(data) -> Any:
    return pickle.loads(data)


def discard_shm(segments: list) -> None:
    """Take back payload segments whose message was never sent."""
    for seg in segments:
        if isinstance(seg, _Segment):
            _pool.give(seg)
        else:
            try:
                os.unlink(seg)
            except FileNotFoundError:
                pass


def sweep_shm(prefix: str) -> int:
    """Remove every shared-memory file whose name contains ``prefix`` (the session tag):
    unclaimed payloads, and files components named after the session (``session_tag()``)."""
    if SHM_DIR is None:
        return 0
    n = 0
    for name in os.listdir(SHM_DIR):
        if prefix in name:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                n += 1
            except FileNotFoundError:
                pass
    return n


def find_unpicklable(args: tuple, kwargs: dict) -> str | None:
    """Name the first argument that cannot be pickled, e.g. ``"argument 1 (a Lock)"``."""
    for i, a in enumerate(args):
        try:
            cloudpickle.dumps(a)
        except Exception as e:  # noqa: BLE001 - any failure means "not picklable"
            return f"positional argument {i} ({type(a).__name__}): {e}"
    for k, v in kwargs.items():
        try:
            cloudpickle.dumps(v)
        except Exception as e:  # noqa: BLE001
            return f"keyword argument {k!r} ({type(v).__name__}): {e}"
    return None
