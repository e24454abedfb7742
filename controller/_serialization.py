"""Message serialization: cloudpickle, with large tensors and arrays moved through shared memory.

Closures, lambdas and locally defined classes travel by value (cloudpickle). A torch tensor
or numpy array of at least ``SHM_THRESHOLD`` bytes is not copied into the byte stream:
the sender copies it once into a fresh file under /dev/shm and pickles only a reference; the
receiver maps that file and unlinks it at once, so the resulting tensor owns its memory
outright (the sender's tensor is untouched and unaliased). One memcpy per direction.

Files are named ``forge-<root pid>-<session>-...`` so the root controller can remove any that
a crashed receiver never claimed.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import uuid

import cloudpickle

SHM_THRESHOLD = 64 * 1024
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

_shm_prefix = f"forge-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def set_shm_prefix(prefix: str) -> None:
    """Name shared-memory files after the root session, so its shutdown can sweep them."""
    global _shm_prefix
    _shm_prefix = prefix


def shm_prefix() -> str:
    return _shm_prefix


def _new_shm(nbytes: int) -> tuple[str, mmap.mmap]:
    path = os.path.join(SHM_DIR, f"{_shm_prefix}-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, mm


def _claim_shm(path: str, nbytes: int) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise RuntimeError(
            f"shared-memory payload {path} is gone: was this message delivered twice, or did "
            "the sender's session end?"
        ) from None
    try:
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE)
    finally:
        os.close(fd)
        os.unlink(path)


def _rebuild_tensor(path, nbytes, dtype_name, shape, device, requires_grad):
    import torch

    dtype = getattr(torch, dtype_name)
    mm = _claim_shm(path, nbytes)
    numel = 1
    for s in shape:
        numel *= s
    # frombuffer keeps a reference to the mmap: the mapping lives exactly as long as the tensor.
    t = torch.frombuffer(mm, dtype=dtype, count=numel).view(shape)
    if device != "cpu":
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_array(path, nbytes, dtype_str, shape):
    import numpy as np

    mm = _claim_shm(path, nbytes)
    return np.frombuffer(mm, dtype=np.dtype(dtype_str)).reshape(shape)


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
        path, mm = _new_shm(nbytes)
        self.shm_paths.append(path)
        dst = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
        dst.copy_(src.reshape(-1).view(torch.uint8))
        del dst
        mm.close()
        dtype_name = str(src.dtype).removeprefix("torch.")
        args = (path, nbytes, dtype_name, tuple(src.shape), device, obj.requires_grad)
        return _rebuild_tensor, args

    def _reduce_array(self, obj, np):
        src = np.ascontiguousarray(obj)
        path, mm = _new_shm(src.nbytes)
        self.shm_paths.append(path)
        np.frombuffer(mm, dtype=np.uint8)[:] = src.reshape(-1).view(np.uint8)
        mm.close()
        return _rebuild_array, (path, src.nbytes, src.dtype.str, src.shape)


_TENSOR_TYPES: tuple | None = None


def _tensor_types(torch) -> tuple:
    global _TENSOR_TYPES
    if _TENSOR_TYPES is None:
        _TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
    return _TENSOR_TYPES


def dumps(obj, use_shm: bool = True) -> tuple[bytes, list[str]]:
    """Serialize ``obj``; returns the bytes and the shared-memory files it created.

    If pickling fails, any shared-memory files already written are removed.
    """
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
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


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
