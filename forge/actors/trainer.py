"""The ``Trainer`` actor: the policy being optimised, on a mesh of P data-parallel ranks.

Spawn it with a :class:`~forge.training.TrainerConfig` (build the config in the controller,
so a bad value fails there, before any process starts)::

    trainer = await Trainer.options(procs=2).as_actor(TrainerConfig(model=path, ...))
    metrics = (await trainer.train_step.call([batch_rank0, batch_rank1])).item(procs=0)
    handle = (await trainer.push_weights.call(version)).item(procs=0)
    await generator.update_weights.call(handle)      # pulls with forge.weights.pull_handle

Endpoints (all ranks take part in each call, so use ``call``, not ``choose``; with one rank,
``call_one`` works too):

``setup()``
    Run by the runtime on every rank at spawn: joins the process group when P > 1 (gloo on
    CPU, NCCL on GPU; the runtime sets the rendezvous variables), loads the model, wraps it
    (``parallelism``: ``ddp`` or ``fsdp``), builds AdamW, the LR schedule and the loss.
``train_step(batch) -> dict``
    One optimizer update. ``batch`` is a ``TrainBatch`` (every rank trains on it: use with one
    rank) or a list of P of them, rank r taking element r. Returns the metrics of the global
    batch, the same on every rank: ``loss``, ``grad_norm`` (before clipping), ``lr``,
    ``tokens`` (response tokens), ``seconds``, ``step`` and the loss's own metrics.
``push_weights(version) -> WeightHandle | None``
    Publishes the full HF-named state dict (with ``lora``: only the adapter tensors and
    their spec, ``forge.weights.adapter``) as ``version`` through ``forge.weights`` (shared
    memory by default, ``weights.type="safetensors_dir"`` for a shared filesystem) and
    returns the picklable handle on rank 0, ``None`` elsewhere. Under FSDP the shards are
    gathered to rank 0 first (a collective). Only rank 0 writes. ``weights.keep_last``
    versions are kept.
``accumulate(batch) -> float`` / ``apply_accumulated() -> dict``
    Trajectory streaming (one trainer rank): forward/backward each part of a step's batch as
    it arrives, then one optimizer update equal to ``train_step`` on all parts together.
``forward_backward_datums(datums, loss_fn, config, forward_only)`` / ``optim_step(adam)``
    Token datums with the Tinker API's losses and an explicit Adam step (one rank; used by
    ``forge serve``, see ``forge.training.datums``).
``set_loss(loss_cfg)``
    Train with this ``LossConfig`` from the next ``train_step`` on (a schedule phase that
    changes the loss type, ``kl_coef``, clipping, ...; see ``forge.training.phases``). The
    optimizer and LR schedule state are kept. Call it on every rank (``call``).
``save(path) -> str`` / ``load(path) -> int``
    Checkpoint weights, optimizer, schedule, step and RNG states
    (``forge.training.trainer_checkpoint``); ``load`` returns the restored step.
``export_hf(path) -> str | None``
    Write the current weights as an HF model directory on rank 0 (e.g. an SFT result handed
    to an RL run); the path on rank 0, ``None`` elsewhere. With ``lora``: the PEFT adapter
    directory instead (its ``adapter_config.json`` names the base; ``forge export --merge``
    makes a plain model of it).
``logprobs(batch) -> Tensor``
    ``[B, T]`` logprobs of every attended token (prompt too) of a ``TrainBatch`` at the
    current weights, no grad; for checks and trainer/reference comparisons.
``state_dict() -> dict``
    The full HF-named weights on rank 0 (``{}`` on other ranks under FSDP).
``offload_optimizer() -> int`` / ``reload_optimizer() -> int``
    Time-sliced colocation (``forge.run.colocate``): move the optimizer state off the GPU to
    host memory while the generator runs, and back before the next step; each returns the
    bytes moved (0 on CPU, where the state already is in host memory). ``memory() -> dict``:
    this rank's host RSS and GPU memory (``forge.observability.memory``).
``close()``
    Drop every pushed weight version (frees ``/dev/shm``). Call before shutting the actor
    down: actor processes exit without running Python finalizers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from controller import current_rank, current_size, endpoint, files, threads
from forge.actors.forge_actor import (
    MODEL_PRELOAD,
    ForgeActor,
    actor_config,
    use_deterministic_kernels,
)
from forge.losses import LossConfig
from forge.models.precision import resolve_device
from forge.observability.memory import (
    apply_memory_fraction,
    memory_snapshot,
    move_optimizer_state,
    release_cached_memory,
)
from forge.training import parallel, trainer_checkpoint
from forge.training.trainer_config import TrainerConfig
from forge.types import TrainBatch
from forge.weights import WeightHandle, WeightStore, build_transport
from forge.weights.relay import remember_latest
from forge.weights.store import cast_floating

__all__ = ["Trainer"]


def _world() -> int:
    """Processes in this actor's mesh (1 when called outside an actor)."""
    return math.prod(current_size().values()) if current_size() else 1


class Trainer(ForgeActor):
    """The policy trainer, one process per data-parallel rank; the module docstring details
    each endpoint. Every rank takes part in every call, so callers use ``call``:

    - ``train_step`` (the training loop: ``forge.run.batches.train_next``, ``apps/sft``);
      ``accumulate`` / ``apply_accumulated`` (``forge.run.batches.train_streamed``);
    - ``push_weights`` (``forge.run.weights.WeightSync``, after each update; rank 0 returns
      the handle generators and reference models pull);
    - ``set_loss`` (``forge.training.phases``, when a schedule phase starts);
    - ``save`` / ``load`` (``forge.run.checkpoint``); ``export_hf`` (``apps/sft``);
    - ``logprobs``, ``state_dict`` (tests and checks); ``close`` (before shutdown).
    """

    preload = MODEL_PRELOAD

    _busy_name = "trainer"

    def __init__(self, config: TrainerConfig | dict) -> None:
        self.cfg = actor_config(TrainerConfig, config, "Trainer")
        self.core = None
        self.store: WeightStore | None = None
        self._offloaded: dict = {}  # optimizer state moved to host: (param id, key) -> device

    @endpoint
    def setup(self) -> None:
        use_deterministic_kernels()
        self.cfg = self.cfg.with_precision()  # ``auto`` decided here, on this process's device
        device = resolve_device(self.cfg.device)
        if device.startswith("cuda"):
            # One GPU of its own per rank (disjoint placement: CUDA_VISIBLE_DEVICES), else
            # every GPU visible and rank r on GPU r.
            rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(rank if torch.cuda.device_count() > 1 else 0)
        apply_memory_fraction(self.cfg.memory_fraction, "trainer")
        parallel.init_distributed(_world(), device)
        from forge.training.trainer_core import TrainerCore

        self.core = TrainerCore(self.cfg)
        if self.core.rank == 0:
            self.store = self._build_store()

    def _build_store(self) -> WeightStore:
        w = self.cfg.weights
        # shm with no prefix: the run's publication location, where pullers with no prefix
        # look (a restarted generator finds the latest version there by itself). It is under
        # the session tag, so the controller sweeps the files if we are killed.
        transport = build_transport(w)
        if w.type == "shm" and not w.prefix:
            for stale in transport.versions():  # a previous trainer of this session
                transport.drop(stale)
        return WeightStore(transport, keep_last=w.keep_last)

    def _my_batch(self, batch: TrainBatch | Sequence[TrainBatch]) -> TrainBatch:
        if isinstance(batch, TrainBatch):
            return batch
        if isinstance(batch, (list, tuple)):
            size, rank = _world(), current_rank().rank
            if len(batch) != size:
                raise ValueError(
                    f"train_step got a list of {len(batch)} batches for a trainer of {size} "
                    "ranks; pass one TrainBatch per rank (or one TrainBatch for all)"
                )
            if not isinstance(batch[rank], TrainBatch):
                raise TypeError(
                    f"train_step batch[{rank}] is {type(batch[rank]).__name__}, not a TrainBatch"
                )
            return batch[rank]
        raise TypeError(
            f"train_step takes a TrainBatch or a list of them (one per rank), got {type(batch).__name__}"
        )

    @endpoint
    def offload_optimizer(self) -> int:
        """Move the optimizer state to host memory (colocation) and free the gradients (the
        next ``train_step`` sets them anew); bytes moved."""
        self.core.optimizer.zero_grad(set_to_none=True)
        moved, self._offloaded = move_optimizer_state(self.core.optimizer, "cpu")
        release_cached_memory()
        return moved

    @endpoint
    def reload_optimizer(self) -> int:
        """Move what ``offload_optimizer`` moved back to its device; bytes moved."""
        moved, _ = move_optimizer_state(self.core.optimizer, None, self._offloaded)
        self._offloaded = {}
        return moved

    @endpoint
    def memory(self) -> dict[str, float]:
        """This rank's memory (MiB): host RSS, and GPU allocated/reserved/peak."""
        return memory_snapshot()

    @endpoint
    def train_step(self, batch: TrainBatch | Sequence[TrainBatch]) -> dict[str, float]:
        with self.busy(), threads.compute():
            return self.core.train_step(self._my_batch(batch))

    @endpoint
    def accumulate(self, batch: TrainBatch | Sequence[TrainBatch]) -> float:
        """Trajectory streaming: forward/backward one part of this step's batch now (the
        first groups in, while the rest is generated); ``apply_accumulated`` then steps once.
        The update equals ``train_step`` on all parts together. One trainer rank only."""
        with self.busy(), threads.compute():
            return self.core.accumulate(self._my_batch(batch))

    @endpoint
    def apply_accumulated(self) -> dict[str, float]:
        """Step on the parts ``accumulate`` gathered; returns ``train_step``'s metrics."""
        with self.busy(), threads.compute():
            return self.core.apply_accumulated()

    @endpoint
    def forward_backward_datums(
        self,
        datums: list[dict],
        loss_fn: str,
        config: dict | None = None,
        forward_only: bool = False,
    ) -> tuple[list[dict], dict[str, float]]:
        """Token datums with the Tinker API's losses (``forge.training.datums``): gradients
        add up until ``optim_step``. One trainer rank (the ``forge serve`` trainers)."""
        from forge.training import datums as ops

        if _world() != 1:
            raise ValueError("forward_backward_datums runs on a trainer of one rank")
        with self.busy(), threads.compute():
            return ops.forward_backward(self.core, datums, loss_fn, config, forward_only)

    @endpoint
    def optim_step(self, adam: dict) -> dict[str, float]:
        """Apply the gradients ``forward_backward_datums`` gathered with these Adam
        parameters, then clear them (``forge.training.datums.optim_step``)."""
        from forge.training import datums as ops

        with self.busy(), threads.compute():
            return ops.optim_step(self.core, adam)

    @endpoint
    def set_loss(self, loss_cfg: LossConfig) -> None:
        self.core.set_loss(loss_cfg)

    @endpoint
    def push_weights(self, version: int) -> WeightHandle | None:
        # A collective under FSDP: every rank calls it. With LoRA: only the adapter tensors.
        state_dict = self.core.push_state_dict()
        if self.store is None:
            return None
        handle = self.store.push(cast_floating(state_dict, self.cfg.weights.dtype), int(version))
        prefix = getattr(self.store.transport, "prefix", None)
        if prefix is not None and handle.source:  # for a replica restarted on another host
            remember_latest(prefix, handle)
        return handle

    @endpoint
    def weight_group(self, members: tuple, renew: bool = False):
        """``weights: {type: broadcast}``: the group spec for this trainer and the replicas
        ``members`` names (re-formed when they change; rank 0 hosts it, ``None`` elsewhere)."""
        if self.store is None:
            return None
        return self._broadcast_transport().group(tuple(members), renew)

    @endpoint
    async def abort_weight_group(self, group_id: str) -> None:
        """Give up the broadcast group ``group_id``: its members stop waiting in it (the
        weight sync calls this when one of them failed; async, so it runs while
        ``send_weights`` blocks this actor's thread)."""
        if self.store is not None:
            self._broadcast_transport().abort(group_id)

    @endpoint
    def send_weights(self, version: int, spec) -> int:
        """Broadcast pushed ``version`` over the group ``spec`` (the replicas receive it at the
        same time, in ``update_weights``); rank 0 sends, other ranks return 0."""
        if self.store is None:
            return 0
        return self._broadcast_transport().send(int(version), spec)

    def _broadcast_transport(self):
        transport = self.store.transport
        if transport.name != "broadcast":
            raise RuntimeError(
                f"the trainer pushes with weights type {transport.name!r}, "
                "not broadcast: replicas pull its versions themselves"
            )
        return transport

    @endpoint
    def save(self, path: str) -> str:
        """Write a checkpoint to ``path`` on the controller's host (every rank its part)."""
        with files.writing(path) as out:
            trainer_checkpoint.save_checkpoint(Path(out), self.core)
        return path

    @endpoint
    def load(self, path: str, weights_only: bool = False) -> int:
        """Restore the checkpoint at ``path`` on the controller's host; ``weights_only``:
        the weights alone, with a fresh optimizer (its state cleared)."""
        with files.staged(path) as local:
            trainer_checkpoint.load_checkpoint(Path(local), self.core, weights_only=weights_only)
        return self.core.step

    @endpoint
    def export_hf(self, path: str) -> str | None:
        """Write the current weights as an HF model directory (config, weights, tokenizer) on
        rank 0, e.g. to hand an SFT result to an RL run. Returns the path (``None`` elsewhere)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from forge.models import load_tokenizer, local_source

        if self.cfg.lora is not None:
            return self._export_adapter(path)
        state = self.core.hf_state_dict()
        if current_rank().rank != 0:
            return None
        source = local_source(self.cfg.model)
        config = AutoConfig.from_pretrained(source)
        model = AutoModelForCausalLM.from_config(config)
        result = model.load_state_dict(
            {k: v.detach().cpu() for k, v in state.items()}, strict=False
        )
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if set(result.missing_keys) - tied or result.unexpected_keys:
            raise RuntimeError(
                f"export_hf: weights do not match {self.cfg.model}'s architecture: missing "
                f"{result.missing_keys}, unexpected {result.unexpected_keys}"
            )
        with files.writing(path) as out:  # on the controller's host, wherever we run
            model.save_pretrained(out)
            load_tokenizer(source).save_pretrained(out)
        return path

    def _export_adapter(self, path: str) -> str | None:
        """LoRA: the PEFT adapter directory (``adapter_config.json`` names the base model),
        plus the tokenizer; ``forge export RUN_DIR --merge OUT`` merges it into a plain model,
        and Forge's trainers and generators load it as its merged model."""
        from forge.models import load_tokenizer, local_source

        if current_rank().rank != 0:
            return None
        with files.writing(path) as out:
            self.core.adapter.peft.save_pretrained(out, save_embedding_layers=False)
            load_tokenizer(local_source(self.cfg.model)).save_pretrained(out)
        return path

    @endpoint
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        with torch.no_grad():
            b = batch
            lp_bt = self.core.logprobs(
                b.input_ids_bt.to(self.core.device), b.attention_mask_bt.to(self.core.device)
            )
        return lp_bt.cpu()

    @endpoint
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.core.hf_state_dict().items()}

    @endpoint
    def close(self) -> None:
        """Drop every pushed weight version now (also done by ``teardown`` on shutdown)."""
        self.teardown()

    def teardown(self) -> None:
        """Runtime hook on graceful stop: remove this trainer's weight files."""
        if self.store is not None:
            self.store.close()
            self.store = None
