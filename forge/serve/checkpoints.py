"""``forge serve``'s checkpoints on disk, and sampling from them.

Two kinds, both under ``serve.dir``, both with ``CHECKPOINT_META`` (the served base model's
name, the API's ``lora_config`` and the adapters' alpha) beside the adapter:

- ``tinker://<model_id>/weights/<name>`` (``save_state``): the trainer's whole checkpoint
  (adapter, optimizer, step; ``forge.training.trainer_checkpoint``) in
  ``<dir>/<model_id>/<name>``;
- ``tinker://<model_id>/sampler_weights/<name>`` (``save_weights_for_sampler`` with a name):
  the adapter alone (``adapter.safetensors``, the tensors the trainer pushed) in
  ``<dir>/<model_id>/sampler_weights/<name>``.

A sampling client may name either: ``load_for_sampling`` reads the adapter and loads it into
the base model's generator as an adapter of its own (``checkpoint:<path>``), next to the
training clients' (per-row LoRA), so a teacher checkpoint samples while the student trains,
and a checkpoint written before a restart samples after it. It is loaded once; a checkpoint
saved again under the same name is loaded again, as a new version."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.serve.futures import UserError

CHECKPOINT_META = "forge_serve.json"  # a checkpoint's base model, lora_config and alpha
ADAPTER_FILE = "adapter.safetensors"  # as forge.training.trainer_checkpoint names it
SAMPLER_DIR = "sampler_weights"  # <dir>/<model_id>/sampler_weights/<name>


@dataclass
class LoadedCheckpoint:
    """A checkpoint loaded into its base model's generator as ``adapter`` at ``version``."""

    base: str
    adapter: str
    version: int
    stamp: int  # the adapter file's mtime (ns) when loaded: a newer file is loaded again


def parse_path(path: str) -> tuple[str, str, str]:
    """``tinker://<model_id>/<kind>/<name>`` -> (model_id, kind, name)."""
    prefix = "tinker://"
    parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
    if len(parts) != 3 or not all(parts):
        raise UserError(f"{path!r} is not a tinker://<model_id>/<kind>/<name> path")
    return parts[0], parts[1], parts[2]


def meta_of(m: Any, alpha: float) -> dict:
    """``CHECKPOINT_META``'s content for a checkpoint of ``m`` (a ``state.ServedModel``)."""
    return {"base_model": m.base.name, "lora_config": m.lora_request, "lora_alpha": alpha}


def checkpoint_meta(source: Path) -> dict:
    """A checkpoint's ``CHECKPOINT_META`` (base model and lora_config), checked."""
    try:
        meta = json.loads((source / CHECKPOINT_META).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"the checkpoint at {source.name} is unreadable ({e})") from None
    if not (
        isinstance(meta, dict)
        and isinstance(meta.get("base_model"), str)
        and isinstance(meta.get("lora_config") or {}, dict)
        and isinstance(meta.get("lora_alpha", 1.0), (int, float))
    ):
        raise UserError(f"the checkpoint at {source.name} has a malformed {CHECKPOINT_META}")
    return meta


async def write_checkpoint(m: Any, target: Path, alpha: float) -> None:
    """``m``'s trainer state and ``CHECKPOINT_META`` written to ``target``: in a new directory
    beside it, flushed to disk, then renamed over it in one step (``forge.durable``), so a
    save that fails (a full disk) or is killed leaves the previous checkpoint of that name
    whole and loadable, and removes what it wrote."""
    from forge.durable import publish_dir

    tmp = target.with_name(f".tmp-{target.name}-{uuid.uuid4().hex[:8]}")  # no client name
    try:
        await m.trainer.save.call_one(str(tmp))
        (tmp / CHECKPOINT_META).write_text(json.dumps(meta_of(m, alpha)))
        await asyncio.to_thread(publish_dir, tmp, target)
    finally:
        # What failed to publish, or, after a swap, the previous checkpoint of that name.
        await asyncio.to_thread(shutil.rmtree, tmp, True)


async def write_sampler_weights(m: Any, handle: Any, target: Path, alpha: float) -> None:
    """The adapter version ``handle`` points to (just pushed by ``m``'s trainer) and
    ``CHECKPOINT_META`` written to ``target`` as ``write_checkpoint`` writes (atomically)."""
    from safetensors.torch import save_file

    from forge.durable import publish_dir
    from forge.weights import pull_handle, unpack_adapter

    adapter = unpack_adapter(await asyncio.to_thread(pull_handle, handle))
    if adapter is None:
        raise RuntimeError(f"{m.model_id}: the trainer pushed full weights, not an adapter")
    tensors = {k: v.contiguous() for k, v in adapter[1].items()}
    tmp = target.with_name(f".tmp-{target.name}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        await asyncio.to_thread(save_file, tensors, str(tmp / ADAPTER_FILE))
        (tmp / CHECKPOINT_META).write_text(json.dumps(meta_of(m, alpha)))
        await asyncio.to_thread(publish_dir, tmp, target)
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)


def checkpoint_source(state: Any, tinker_path: str) -> Path:
    """The directory of the checkpoint ``tinker_path`` names (``weights`` or
    ``sampler_weights``) on ``state`` (a ``state.ServerState``), or ``UserError`` saying why
    there is none."""
    model_id, kind, name = parse_path(tinker_path)
    if kind == "weights":
        source = state.checkpoint_dir(model_id, name)
    elif kind == SAMPLER_DIR:
        source = state.sampler_dir(model_id, name)
    else:
        raise UserError(
            f"{tinker_path!r}: {kind!r} is not a checkpoint kind of this server "
            "(tinker://<model_id>/weights/<name> or .../sampler_weights/<name>)"
        )
    if not (source / CHECKPOINT_META).is_file() or not (source / ADAPTER_FILE).is_file():
        raise UserError(
            f"no checkpoint {tinker_path!r} on this server (save_state writes "
            "tinker://<model_id>/weights/<name>, save_weights_for_sampler(name) "
            "tinker://<model_id>/sampler_weights/<name>)"
        )
    return source


async def load_for_sampling(state: Any, tinker_path: str) -> LoadedCheckpoint:
    """The checkpoint ``tinker_path`` loaded into its base model's generator (once per
    saved file; see the module docstring)."""
    from safetensors.torch import load_file

    from forge.serve.serve_config import resolve_path
    from forge.weights import AdapterSpec, pack_adapter

    source = checkpoint_source(state, tinker_path)
    meta = checkpoint_meta(source)
    stamp = (source / ADAPTER_FILE).stat().st_mtime_ns
    loaded = state.checkpoints.get(tinker_path)
    if loaded is not None and loaded.stamp == stamp:
        return loaded
    try:
        base = state.cfg.base(meta["base_model"])
    except KeyError as e:
        raise UserError(f"{tinker_path!r}: {e.args[0]}") from None
    lora, _ = state.lora_for(meta["lora_config"], base)
    alpha = float(meta.get("lora_alpha", state.cfg.lora_alpha))
    spec = AdapterSpec(resolve_path(base), lora.rank, alpha, tuple(lora.target_modules))
    tensors = await asyncio.to_thread(load_file, str(source / ADAPTER_FILE))
    generator = await state.base_generator(base.name)
    name = f"checkpoint:{tinker_path}"
    async with state.checkpoint_lock:
        version = state.next_checkpoint_version()
        handle = await asyncio.to_thread(
            state.checkpoint_store().push, pack_adapter(tensors, spec), version
        )
        await generator.load_adapter.fanout(name, handle)
    loaded = LoadedCheckpoint(base.name, name, version, stamp)
    state.checkpoints[tinker_path] = loaded
    return loaded


def base_of(state: Any, tinker_path: str) -> str:
    """The served base model a checkpoint (or a live training client's sampler path) is
    over, read without loading anything."""
    model_id = parse_path(tinker_path)[0]
    m = state.models.get(model_id)
    if m is not None and tinker_path in m.samplers:
        return m.base.name
    return checkpoint_meta(checkpoint_source(state, tinker_path))["base_model"]
