"""A process's memory: measured (host RSS always, GPU allocated/reserved/peak when this
process uses CUDA), capped (the GPU memory share a placement gives a role), handed back
(cached CUDA blocks), and the optimizer state moved off the device and back (time-sliced
colocation: the AdamW moments, twice the parameters, are the largest thing a trainer can
hand back without reloading its model).

    snap = memory_snapshot()   # {"rss_mb": ..., "gpu_allocated_mb": ..., "gpu_peak_mb": ...}
    apply_memory_fraction(0.35, "generator")
    moved, where = move_optimizer_state(optimizer, "cpu")     # before generating
    moved, _ = move_optimizer_state(optimizer, None, where)    # before the next step

Kept free of the actor runtime (torch and psutil only), so ``scripts/gpu_check.sh`` uses it
where only torch, transformers and peft are installed.

``gpu_peak_mb`` is the peak since the previous snapshot (each snapshot resets torch's peak
counter), so snapshots taken at phase ends give each phase's peak.
"""

from __future__ import annotations

import gc
import os

import psutil
import torch

__all__ = [
    "apply_memory_fraction",
    "memory_snapshot",
    "move_optimizer_state",
    "release_cached_memory",
    "tensor_bytes",
]

MB = 2**20


def memory_snapshot(reset_peak: bool = True) -> dict[str, float]:
    """This process's memory in MiB: ``rss_mb``, and with CUDA in use ``gpu_allocated_mb``,
    ``gpu_reserved_mb`` and ``gpu_peak_mb`` (since the last snapshot with ``reset_peak``)."""
    out = {"rss_mb": psutil.Process(os.getpid()).memory_info().rss / MB}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["gpu_allocated_mb"] = torch.cuda.memory_allocated() / MB
        out["gpu_reserved_mb"] = torch.cuda.memory_reserved() / MB
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / MB
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
    return out


def apply_memory_fraction(fraction: float, role: str) -> None:
    """Cap this process's CUDA caching allocator at ``fraction`` of the device's memory
    (``placement.<role>_memory``); 0 leaves it uncapped. Without a GPU, a ``RuntimeError``:
    a cap nothing enforces would be a silent no-op."""
    if not fraction:
        return
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{role}.memory_fraction={fraction} caps this process's share of a GPU's memory "
            "(placement), but no GPU is visible here (torch.cuda.is_available() is False); "
            "remove the placement shares on a machine without GPUs"
        )
    torch.cuda.set_per_process_memory_fraction(fraction)


def tensor_bytes(tensors) -> int:
    """Bytes held by ``tensors`` (each storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.is_meta or t.layout != torch.strided:
            continue  # (meta and sparse tensors hold no storage of their own to count)
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if storage.nbytes() and key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def release_cached_memory() -> None:
    """With CUDA in use: collect freed objects now (tensors in reference cycles) and hand
    cached blocks back to the device, so another process on the same GPU (a colocated
    generator or trainer) can use them. On CPU, freed tensors go back at once: nothing to do
    (a full collection costs a few hundred ms in a large process)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


@torch.no_grad()
def move_optimizer_state(
    optimizer: torch.optim.Optimizer,
    device: str | None,
    where: dict[tuple[int, str], torch.device] | None = None,
) -> tuple[int, dict[tuple[int, str], torch.device]]:
    """Move ``optimizer``'s state tensors to ``device`` (``None``: back to the devices in
    ``where``, as an earlier call returned them). Returns (bytes moved, ``where``: each moved
    tensor's ``(parameter index, key) -> device it came from``)."""
    moved, came_from = 0, {}
    for i, state in enumerate(optimizer.state.values()):
        for key, t in list(state.items()):
            if not isinstance(t, torch.Tensor):
                continue
            target = torch.device(device) if device is not None else (where or {}).get((i, key))
            if target is None or t.device == target:
                continue
            # (Plain tensors only: an FSDP DTensor moves its local shard with ``to``.)
            pin = target.type == "cpu" and torch.cuda.is_available() and type(t) is torch.Tensor
            if pin:
                state[key] = _pinned_copy(t)
            else:  # back to the GPU: asynchronous from pinned memory (synchronised below)
                asynchronous = (
                    torch.cuda.is_available() and t.device.type == "cpu" and t.is_pinned()
                )
                state[key] = t.to(target, non_blocking=asynchronous)
            came_from[(i, key)] = t.device
            moved += t.numel() * t.element_size()
    if moved and torch.cuda.is_available():
        torch.cuda.synchronize()
    return moved, came_from


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in page-locked host memory (so the copy back is asynchronous)."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out
