"""The ``Critic`` actor: PPO's value model, trained alongside the policy.

Spawn it with a :class:`~forge.training.value_model.CriticConfig` (built in the controller, so a
bad value fails before any process starts). One PPO step of the app then reads::

    critic = await Critic.as_actor(CriticConfig(model=path, optimizer={"lr": 1e-5}))
    values_bt = await critic.values.call_one(batch)                  # before any update
    adv_bt, returns_bt = ppo_advantages_for_batch(batch, rewards_b, values_bt, gamma, lam)
    batch.advantages_b = adv_bt                                      # per-token, loss "ppo"
    await trainer.train_step.call_one(batch)
    await critic.train_step.call_one(batch, returns_bt, values_bt)   # values_bt: old values

The critic runs on one process (``procs=1``): it is not data parallel; ``setup`` refuses a
larger mesh. ``micro_batch_size`` bounds its memory instead.

Endpoints:

``setup()``
    Run by the runtime at spawn: loads the value model (the causal LM's body plus a
    zero-initialised scalar head, see ``forge.training.value_model``), AdamW and the schedule.
``values(batch) -> Tensor``
    ``[B, T]`` float32 CPU values of a ``TrainBatch``, no grad: position t holds the estimate
    of the return in the state "tokens < t" (aligned with logprobs), 0 at position 0 and on
    padding. Prompt positions hold values too; only counted tokens are used downstream.
``train_step(batch, returns_bt, old_values_bt=None) -> dict``
    One update of the clipped value loss on the batch's counted tokens (``batch`` may be a
    list of batches, with lists of returns and old values: still one update, on all of them;
    ``forge.run.gae_critic`` passes a step's per-rank batches so); ``old_values_bt``
    (the ``values`` the returns were computed with) centres the clip range, ``None`` uses the
    current values. Returns ``value_loss``, ``value_clip_fraction``, ``explained_variance``,
    ``value_mean``, ``return_mean``, ``grad_norm``, ``lr``, ``tokens``, ``step``, ``seconds``.
``save(path) -> str`` / ``load(path) -> int``
    Weights, optimizer, schedule and step in ``path/critic_state.pt``; ``load`` returns the
    restored step.
"""

from __future__ import annotations

import math
import os

import torch

from controller import current_size, endpoint, threads
from forge.actors.forge_actor import (
    MODEL_PRELOAD,
    ForgeActor,
    actor_config,
    use_deterministic_kernels,
)
from forge.models.precision import resolve_device
from forge.training.value_model import CriticConfig
from forge.types import TrainBatch

__all__ = ["Critic"]


def _check_batch(batch: object, endpoint_name: str) -> TrainBatch:
    if not isinstance(batch, TrainBatch):
        raise TypeError(f"Critic.{endpoint_name} takes a TrainBatch, got {type(batch).__name__}")
    return batch


class Critic(ForgeActor):
    """The value model; see the module docstring for its endpoints."""

    _busy_name = "critic"
    preload = MODEL_PRELOAD

    def __init__(self, config: CriticConfig | dict) -> None:
        self.cfg = actor_config(CriticConfig, config, "Critic")
        self.core = None

    @endpoint
    def setup(self) -> None:
        use_deterministic_kernels()
        procs = math.prod(current_size().values()) if current_size() else 1
        if procs != 1:
            raise ValueError(
                f"the Critic runs on one process, got a mesh of {procs}; spawn it with procs=1 "
                "(use CriticConfig.micro_batch_size to bound its memory)"
            )
        if resolve_device(self.cfg.device).startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        from forge.training.value_model import CriticCore

        self.core = CriticCore(self.cfg)

    @endpoint
    def values(self, batch: TrainBatch) -> torch.Tensor:
        with self.busy(), threads.compute():
            return self.core.batch_values(_check_batch(batch, "values"))

    @endpoint
    def train_step(
        self,
        batch: TrainBatch | list[TrainBatch],
        returns_bt: torch.Tensor | list[torch.Tensor],
        old_values_bt: torch.Tensor | list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        batches = batch if isinstance(batch, list) else [batch]
        for b in batches:
            _check_batch(b, "train_step")
        with self.busy(), threads.compute():
            return self.core.train_step(batch, returns_bt, old_values_bt)

    @endpoint
    def save(self, path: str) -> str:
        return str(self.core.save(path))

    @endpoint
    def load(self, path: str) -> int:
        return self.core.load(path)
