"""Weight transfer over an existing ``torch.distributed`` group (NCCL between GPUs, gloo on CPU).

:func:`broadcast_state_dict` sends the source rank's state dict to every rank in the group:

1. the manifest (names, dtypes, shapes, in order) goes first with ``broadcast_object_list``,
   so receivers can allocate or check their destination tensors;
2. tensors are grouped by dtype and packed into flat buckets of up to ``bucket_mb``, one
   ``broadcast`` per bucket (a few large collectives instead of hundreds of small ones);
3. receivers split each bucket back into the named tensors.

Buckets travel as raw bytes (a ``uint8`` view), so every dtype, bf16 included, works on
every backend and arrives bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from forge.weights.store import check_into_keys, copy_into, dtype_from_name, dtype_name

__all__ = ["Bucket", "broadcast_state_dict", "plan_buckets"]


@dataclass(frozen=True)
class Bucket:
    """Tensors of one dtype sent in one collective, in order."""

    dtype: torch.dtype
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numels(self) -> list[int]:
        return [_numel(shape) for shape in self.shapes]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_buckets(
    manifest: list[tuple[str, str, tuple[int, ...]]], bucket_bytes: int
) -> list[Bucket]:
    """Group ``(name, dtype, shape)`` rows by dtype into buckets of at most ``bucket_bytes``.

    Order within a dtype follows the manifest. A tensor larger than ``bucket_bytes`` gets a
    bucket of its own. Deterministic, so every rank computes the same plan.
    """
    by_dtype: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, dtype, shape in manifest:
        by_dtype.setdefault(dtype, []).append((name, tuple(shape)))
    buckets = []
    for dtype_str, rows in by_dtype.items():
        dtype = dtype_from_name(dtype_str)
        item = torch.empty((), dtype=dtype).element_size()
        names: list[str] = []
        shapes: list[tuple[int, ...]] = []
        size = 0
        for name, shape in rows:
            nbytes = _numel(shape) * item
            if names and size + nbytes > bucket_bytes:
                buckets.append(Bucket(dtype, tuple(names), tuple(shapes)))
                names, shapes, size = [], [], 0
            names.append(name)
            shapes.append(shape)
            size += nbytes
        if names:
            buckets.append(Bucket(dtype, tuple(names), tuple(shapes)))
    return buckets


def broadcast_state_dict(
    state_dict: dict[str, torch.Tensor] | None,
    src: int,
    group: dist.ProcessGroup | None = None,
    bucket_mb: float = 64,
    into: dict[str, torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    timeout: timedelta | float = 300.0,
) -> dict[str, torch.Tensor]:
    """Broadcast ``state_dict`` from global rank ``src`` to every rank of ``group``.

    On ``src`` pass the state dict (it is returned unchanged). On other ranks pass ``None``
    and either ``into`` (e.g. ``model.state_dict()``: received bytes are copied into those
    tensors, which is returned) or nothing (fresh tensors on ``device``, default CPU; use
    ``"cuda"`` with NCCL). Each bucket waits at most ``timeout`` (seconds or a timedelta);
    the manifest exchange is bounded by the group's own timeout from ``init_process_group``.
    """
    if bucket_mb <= 0:
        raise ValueError(f"broadcast_state_dict bucket_mb must be > 0, got {bucket_mb}")
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    is_src = dist.get_rank() == src
    if is_src and state_dict is None:
        raise ValueError(f"broadcast_state_dict: rank {src} is the source but got state_dict=None")
    if is_src:
        manifest = [(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in state_dict.items()]
        box: list = [manifest]
    else:
        box = [None]
    dist.broadcast_object_list(box, src=src, group=group)
    manifest = box[0]
    if into is not None and not is_src:
        check_into_keys(into, [row[0] for row in manifest], f"broadcast from rank {src}")
    if device is None:
        device = next(iter(into.values())).device if into else torch.device("cpu")
    source = f"broadcast from rank {src}"
    out: dict[str, torch.Tensor] = {}
    for bucket in plan_buckets(manifest, int(bucket_mb * 2**20)):
        total = sum(bucket.numels)
        if is_src:
            if total:
                flat = torch.cat([state_dict[n].detach().reshape(-1) for n in bucket.names])
                _broadcast_bytes(flat, src, group, timeout)
            continue
        flat = torch.empty(total, dtype=bucket.dtype, device=device)
        if total:
            _broadcast_bytes(flat, src, group, timeout)
        for name, shape, chunk in zip(bucket.names, bucket.shapes, flat.split(bucket.numels)):
            if into is not None:
                copy_into(into, name, chunk.view(shape), source)
            else:
                # clone: each result owns its memory instead of pinning the whole bucket.
                out[name] = chunk.view(shape).clone()
    if is_src:
        return state_dict
    if into is not None:
        return into
    return {row[0]: out[row[0]] for row in manifest}


def _broadcast_bytes(
    flat: torch.Tensor, src: int, group: dist.ProcessGroup | None, timeout: timedelta
) -> None:
    work = dist.broadcast(flat.view(torch.uint8), src=src, group=group, async_op=True)
    if not work.wait(timeout):
        raise TimeoutError(f"weight broadcast bucket from rank {src} timed out after {timeout}")
