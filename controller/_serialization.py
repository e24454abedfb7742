"""Message serialization: cloudpickle, with large tensors and arrays moved through shared memory.

Closures, lambdas and locally defined classes travel by value (cloudpickle). A torch tensor
or numpy array of at least ``SHM_THRESHOLD`` bytes is not copied into the byte stream: the
sender copies it into a shared-memory segment from its own pool and pickles a reference; the
receiver copies it out into fresh memory it owns (no aliasing with the sender) and marks the
segment released, so the sender can reuse it. Reused segments are already faulted in, so a
transfer costs one warm memcpy plus the receiver's unavoidable copy into new memory.

Segment files are named ``forge-<root pid>-<session>-...`` so the root controller can remove
any that a crashed process left behind.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import threading
import uuid

import cloudpickle

SHM_THRESHOLD = 64 * 1024
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
POOL_CAP_BYTES = int(os.environ.get("FORGE_SHM_POOL_BYTES", str(2 << 30)))
_HEADER = 64  # byte 0: 1 while a receiver has not copied the payload out yet
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_BUSY, _RELEASED = 1, 0

_shm_prefix = f"forge-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def set_shm_prefix(prefix: str) -> None:
    """Name shared-memory files after the root session, so its shutdown can sweep them."""
    global _shm_prefix
    _shm_prefix = prefix


def shm_prefix() -> str:
    return _shm_prefix


class _Segment:
    __slots__ = ("path", "mm", "size")

    def __init__(self, size: int):
        self.size = size
        self.path = os.path.join(SHM_DIR, f"{_shm_prefix}-{uuid.uuid4().hex}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _HEADER + size)
            self.mm = mmap.mmap(fd, _HEADER + size, flags=mmap.MAP_SHARED | _MAP_POPULATE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)

    def released(self) -> bool:
        return self.mm[0] == _RELEASED

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            self.mm.close()
        except BufferError:
            pass


class _Pool:
    """This process's reusable send segments (bounded by ``POOL_CAP_BYTES``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.segments: list[_Segment] = []
        self.busy: set[str] = set()

    def acquire(self, nbytes: int) -> _Segment:
        with self.lock:
            for seg in self.segments:
                if seg.path in self.busy and seg.released():
                    self.busy.discard(seg.path)
            best = None
            for seg in self.segments:
                if seg.path not in self.busy and nbytes <= seg.size <= 2 * nbytes + (1 << 20):
                    if best is None or seg.size < best.size:
                        best = seg
            if best is None:
                self._make_room(nbytes)
                best = _Segment(max(nbytes, 1 << 16))
                self.segments.append(best)
            else:  # most recently used last
                self.segments.remove(best)
                self.segments.append(best)
            self.busy.add(best.path)
            best.mm[0] = _BUSY
            return best

    def _make_room(self, nbytes: int) -> None:
        total = sum(s.size for s in self.segments) + nbytes
        for seg in list(self.segments):
            if total <= POOL_CAP_BYTES:
                break
            if seg.path not in self.busy:
                self.segments.remove(seg)
                total -= seg.size
                seg.close()

    def forget(self, paths: list[str]) -> None:
        """Drop segments whose message was never sent."""
        with self.lock:
            for seg in [s for s in self.segments if s.path in paths]:
                self.segments.remove(seg)
                self.busy.discard(seg.path)
                seg.close()

    def close(self) -> None:
        with self.lock:
            for seg in self.segments:
                seg.close()
            self.segments.clear()
            self.busy.clear()


_pool = _Pool()


def close_pool() -> None:
    _pool.close()


def _claim(path: str, nbytes: int):
    """Map a received segment; returns (mmap, uint8 view of the payload)."""
    import torch

    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise RuntimeError(
            f"shared-memory payload {path} is gone: the sending process exited before the "
            "message was read"
        ) from None
    try:
        mm = mmap.mmap(fd, _HEADER + nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE)
    finally:
        os.close(fd)
    return mm, torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=_HEADER)


def _release(mm) -> None:
    mm[0] = _RELEASED
    mm.close()


def _rebuild_tensor(path, nbytes, dtype_name, shape, device, requires_grad):
    import torch

    dtype = getattr(torch, dtype_name)
    mm, src = _claim(path, nbytes)
    out = torch.empty(nbytes, dtype=torch.uint8)
    out.copy_(src)
    del src
    _release(mm)
    t = out.view(dtype).view(shape)
    if device != "cpu":
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_array(path, nbytes, dtype_str, shape):
    import numpy as np

    mm, src = _claim(path, nbytes)
    out = np.empty(nbytes, dtype=np.uint8)
    out[:] = src.numpy()
    del src
    _release(mm)
    return out.view(np.dtype(dtype_str)).reshape(shape)


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file, use_shm: bool):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.use_shm = use_shm and SHM_DIR is not None
        self.shm_paths: list[str] = []

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
        seg = _pool.acquire(nbytes)
        self.shm_paths.append(seg.path)
        dst = torch.frombuffer(seg.mm, dtype=torch.uint8, count=nbytes, offset=_HEADER)
        dst.copy_(src.reshape(-1).view(torch.uint8))
        del dst
        dtype_name = str(src.dtype).removeprefix("torch.")
        args = (seg.path, nbytes, dtype_name, tuple(src.shape), device, obj.requires_grad)
        return _rebuild_tensor, args

    def _reduce_array(self, obj, np):
        src = np.ascontiguousarray(obj)
        seg = _pool.acquire(src.nbytes)
        self.shm_paths.append(seg.path)
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


def dumps(obj, use_shm: bool = True) -> tuple[bytes, list[str]]:
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
        discard_shm(p.shm_paths)
        raise
    return buf.getvalue(), p.shm_paths


def loads(data) -> object:
    return pickle.loads(data)


def discard_shm(paths: list[str]) -> None:
    """Remove shared-memory payloads that will never be claimed (e.g. the send failed)."""
    if paths:
        _pool.forget(paths)


def sweep_shm(prefix: str) -> int:
    """Remove every unclaimed shared-memory payload whose name starts with ``prefix``."""
    if SHM_DIR is None:
        return 0
    n = 0
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
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
