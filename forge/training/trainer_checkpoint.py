"""Save and restore a trainer exactly: weights, optimizer, schedule, step and RNG states.

Layout of a checkpoint directory::

    model.safetensors     full HF-named weights (with config.json: loadable by load_model)
    config.json
    adapter.safetensors   instead of model.safetensors with ``trainer.lora``: the adapter's
                          tensors only (PEFT's keys); the base is the config's model
    trainer_state.pt      optimizer state keyed by parameter name, scheduler, step
    rng_rank<r>.pt        python, numpy, torch (and CUDA) RNG states of rank r

Rank 0 writes the shared files; every rank writes its RNG file. Optimizer state is keyed by
parameter name (``torch.distributed.checkpoint.state_dict``), so it does not depend on how
the model was wrapped. Restoring into the same world size is exact (a test checks bitwise
equality of two continued runs); RNG files of missing ranks are an error.

Loading unpickles nothing but tensors and plain containers (``torch.load(weights_only=True)``):
a checkpoint may come from someone else (``forge serve``'s ``load_state``, a copied run
directory), and a full unpickler runs whatever code the file names. The numpy RNG state is
stored as a tensor for that reason; files of older Forge versions, which hold it as a numpy
array, still load (the numpy array reconstructors are allowed, nothing else).
"""

from __future__ import annotations

import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from forge.durable import fsync_path, fsync_tree
from forge.training import parallel

__all__ = [
    "load_checkpoint",
    "rng_state",
    "UnsafeCheckpointError",
    "safe_load",
    "save_checkpoint",
    "set_rng_state",
]

MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter.safetensors"
STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    """This process's python, numpy and torch RNG states (tensors and plain values only)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy()
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unaliased(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies; safetensors refuses tensors sharing storage (tied embeddings)."""
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}


def _barrier() -> None:
    if parallel.rank_and_world()[1] > 1:
        dist.barrier()


def save_checkpoint(path: str | Path, core) -> Path:
    """Write ``core`` (a ``TrainerCore``) to ``path``, every file flushed to disk (``fsync``)
    before this returns. Call on every rank (collectives). Callers that replace a checkpoint
    write to a new directory and publish it by renaming (``forge.durable.publish_dir``)."""
    path = Path(path)
    rank, _ = parallel.rank_and_world()
    lora = core.cfg.lora is not None
    weights = _adapter(core) if lora else parallel.full_state_dict(core.model)
    state = core.state()
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        # Native names: a titan model's checkpoint reloads into a titan model.
        save_file(_unaliased(weights), str(path / (ADAPTER_FILE if lora else MODEL_FILE)))
        core.adapter.save_config(path)
        torch.save(state, path / STATE_FILE)
        fsync_tree(path)
    _barrier()  # the directory exists before other ranks write into it
    rng_file = path / f"rng_rank{rank}.pt"
    torch.save(rng_state(), rng_file)
    fsync_path(rng_file)
    _barrier()
    if rank == 0:
        fsync_path(path)  # the other ranks' entries
    return path


def load_checkpoint(path: str | Path, core, weights_only: bool = False) -> None:
    """Restore ``core`` from ``path`` written by ``save_checkpoint``. Call on every rank.
    ``weights_only``: restore the weights alone and clear the optimizer's state (a fresh
    optimizer; the step, schedule and RNG stay as they are)."""
    path = Path(path)
    rank, _ = parallel.rank_and_world()
    rng_file = path / f"rng_rank{rank}.pt"
    if not (path / STATE_FILE).exists() or not rng_file.exists():
        raise FileNotFoundError(
            f"{path} is not a complete trainer checkpoint for rank {rank} (needs {MODEL_FILE}, "
            f"{STATE_FILE} and {rng_file.name}); write one with Trainer.save(dir)"
        )
    if core.cfg.lora is not None:
        _load_adapter(core, path / ADAPTER_FILE)
    else:
        weights = load_file(str(path / MODEL_FILE), device="cpu")
        model_sd = parallel.unwrap(core.model).state_dict()
        # Tied parameters share one tensor: the file holds each name, loading them all is fine.
        weights = {k: v.to(model_sd[k].device) for k, v in weights.items() if k in model_sd}
        parallel.load_full_state_dict(core.model, weights)
    if weights_only:
        core.optimizer.state.clear()
        _barrier()
        return
    core.load_state(safe_load(path / STATE_FILE))
    set_rng_state(safe_load(rng_file))
    _barrier()


def _numpy_array_globals() -> list:
    """What a pickled numpy array needs (older RNG files): its reconstructor and types."""
    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core
    return [multiarray.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file holds pickled objects beyond tensors and plain data, which Forge does
    not load: unpickling them could run any code the file names."""


def safe_load(file: str | Path, map_location: str | None = "cpu") -> Any:
    """``torch.load`` that unpickles only tensors, plain containers and numpy arrays (no
    code). A file that needs more raises ``UnsafeCheckpointError`` naming it."""
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's text suggests weights_only=False; what the file names is worth showing.
        found = re.search(r"GLOBAL ([\w.]+)|but got (<[^>]+>)", str(e))
        what = f"it names {found.group(1) or found.group(2)}" if found else "see torch.load"
        raise UnsafeCheckpointError(
            f"{file}: not loaded: it holds pickled objects other than tensors and plain data "
            f"({what}); Forge loads no such file, as unpickling it could run code"
        ) from None


def _adapter(core) -> dict[str, torch.Tensor]:
    from forge.training.lora import adapter_tensors

    return adapter_tensors(core.adapter.peft)


def _load_adapter(core, file: Path) -> None:
    if not file.exists():
        raise FileNotFoundError(
            f"{file.parent} has no {ADAPTER_FILE}: it is not a checkpoint of a LoRA trainer "
            "(trainer.lora must match the run that wrote it)"
        )
    from forge.training.lora import import_peft

    tensors = load_file(str(file), device=core.device)
    result = import_peft().set_peft_model_state_dict(core.adapter.peft, tensors)
    if result.unexpected_keys:
        raise ValueError(
            f"{file}: adapter tensors {result.unexpected_keys[:3]} do not fit the model"
        )
