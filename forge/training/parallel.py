"""Data parallelism for the trainer: process group, DDP / FSDP2 wrapping, full state dicts.

The actor runtime sets ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
in each process of a mesh; ``init_distributed`` picks the backend (gloo on CPU, NCCL on GPU)
and forms the group's rendezvous store itself: rank 0 hosts it listening on ``MASTER_ADDR``
only (the loopback on one host), where torch's ``env://`` store would listen on every
interface; the store has no authentication (docs/security.md). With one process nothing is
initialised and the model is used as is.

``ddp`` replicates the model and all-reduces (averages) gradients. ``fsdp`` is FSDP2
(``torch.distributed.fsdp.fully_shard``): each decoder layer, then the root, is sharded, so
parameters, gradients and AdamW state are split across ranks; gradients are averaged too.
Both run on CPU with gloo (tested) and on GPUs with NCCL.

Weights leave the trainer in full, HF-named form: ``full_state_dict`` gathers the shards (a
collective: every rank must call it) onto rank 0's CPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = [
    "full_optimizer_state_dict",
    "full_state_dict",
    "init_distributed",
    "load_full_optimizer_state_dict",
    "load_full_state_dict",
    "rank_and_world",
    "unwrap",
    "wrap_model",
]


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default group, ``(0, 1)`` when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(world_size: int, device: str) -> None:
    """Join the default process group when ``world_size > 1`` (idempotent).

    Reads the rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``) from the environment
    (set by the actor runtime), as torch's ``env://`` does, but rank 0's store listens on
    ``MASTER_ADDR`` alone.
    """
    if world_size <= 1 or dist.is_initialized():
        return
    from torch.distributed.constants import default_pg_timeout

    from forge.weights.group import bound_store

    backend = "nccl" if device.startswith("cuda") else "gloo"
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank = int(os.environ["RANK"])
    if rank == 0:
        store = bound_store(host, port, default_pg_timeout)
    else:
        store = dist.TCPStore(host, port, world_size, False, default_pg_timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one (HF ``model.model.layers``, titan ``layers``)."""
    for path in ("model.layers", "layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            return list(obj.values() if isinstance(obj, torch.nn.ModuleDict) else obj)
    return []


def wrap_model(model: torch.nn.Module, parallelism: str, device: str) -> torch.nn.Module:
    """Wrap for data parallelism over the default group; a no-op with one process.

    ``fsdp`` shards in place and returns the same module (FSDP2 swaps its class); ``ddp``
    returns a ``DistributedDataParallel`` wrapper (``unwrap`` gets the model back).
    """
    _, world = rank_and_world()
    if world <= 1:
        return model
    if parallelism == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [torch.device(device).index or 0] if device.startswith("cuda") else None
        # Buffers (rotary tables) are constants: no per-forward broadcast needed.
        return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    raise ValueError(f"unknown parallelism: {parallelism!r}; choose one of ('ddp', 'fsdp')")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user model inside a DDP wrapper (FSDP2 modules are their own model)."""
    return getattr(model, "module", model)


def _is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(unwrap(model), FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full HF-named parameters and buffers: on every rank for DDP and single process, on rank
    0 only (others get ``{}``) under FSDP. A collective under FSDP: call it on every rank."""
    if not _is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=opts)


def load_full_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (needed on rank 0 only under FSDP; every rank otherwise)."""
    if not _is_sharded(model):
        unwrap(model).load_state_dict(state_dict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state_dict, options=opts)


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Optimizer state keyed by parameter name (portable across world sizes); rank 0 only
    under FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=_is_sharded(model))
    return get_optimizer_state_dict(unwrap(model), optimizer, options=opts)


def load_full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Inverse of ``full_optimizer_state_dict`` (rank 0's copy is broadcast under FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    sharded = _is_sharded(model)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=sharded)
    set_optimizer_state_dict(unwrap(model), optimizer, optim_state_dict=state, options=opts)
