"""Freeing a generator's memory while it sleeps (``placement.colocate``), for the hf backend.

Level 1 frees the KV cache (the engine's kept prefixes; nothing runs while asleep). Level 2
also frees the weights, as vLLM's ``sleep(level=2)`` does: the next weight push replaces them
anyway. ``drop_weights`` empties every parameter and persistent buffer in place (the module
tree, tied parameters and non-persistent buffers such as rotary tables stay), remembering
shapes; ``materialize_weights`` gives them uninitialised storage of those shapes again, for a
weight update to fill. Between the two the model cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DroppedWeights", "drop_weights", "materialize_weights"]


@dataclass(frozen=True)
class DroppedWeights:
    """What ``drop_weights`` freed: ``name -> (shape, dtype, device)`` for every name (tied
    aliases too), and the bytes of the distinct tensors."""

    specs: dict[str, tuple[tuple[int, ...], torch.dtype, torch.device]]
    nbytes: int


@torch.no_grad()
def drop_weights(model: torch.nn.Module) -> DroppedWeights:
    """Free the storage of ``model``'s parameters and persistent buffers (each tied tensor
    once); returns what ``materialize_weights`` needs to give it back."""
    own = model.state_dict(keep_vars=True)
    specs, seen, nbytes = {}, {}, 0
    for name, t in own.items():
        if id(t) not in seen:
            seen[id(t)] = (tuple(t.shape), t.dtype, t.device)
            nbytes += t.numel() * t.element_size()
        specs[name] = seen[id(t)]
    for t in {id(t): t for t in own.values()}.values():
        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    return DroppedWeights(specs, nbytes)


@torch.no_grad()
def materialize_weights(model: torch.nn.Module, dropped: DroppedWeights) -> None:
    """Give the tensors ``drop_weights`` emptied uninitialised storage of their shapes (the
    caller loads weights into it next); tied tensors stay one tensor."""
    done = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in done:
            shape, dtype, device = dropped.specs[name]
            t.data = torch.empty(shape, dtype=dtype, device=device)
            done.add(id(t))
