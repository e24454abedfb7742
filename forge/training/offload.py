"""Moving a trainer's optimizer state between its device and host memory.

Time-sliced colocation (``placement.colocate``) gives the GPU to the generator while rollouts
run; the trainer's AdamW moments (twice the parameters, in float32) are the largest thing it
can hand back without reloading its model, so they go to host memory meanwhile::

    moved, where = move_optimizer_state(optimizer, "cpu")     # before generating
    moved, _ = move_optimizer_state(optimizer, None, where)    # before the next step

Only tensors not already on the target move: on a CPU trainer nothing moves (0 bytes), and
the scalar ``step`` counters AdamW keeps on the CPU stay there.
"""

from __future__ import annotations

import torch

__all__ = ["move_optimizer_state"]


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
            state[key] = t.to(target, non_blocking=pin) if not pin else _pinned_copy(t)
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
