"""PPO's value side: a critic gives per-token values, GAE turns the batch's terminal rewards
into per-token advantages, and the critic trains on the returns, beside the policy update.

    values -> GAE(gamma, lambda) -> batch.advantages_b = A[B, T] -> trainer (loss type ppo)
                                 -> critic.train_step(batch, returns, old values)

Enabled by a ``critic`` section in a run's config (``forge.training.value_model.CriticConfig``);
the trainer's loss must then take per-token advantages (``ppo`` or ``reinforce``).

One policy step is one critic step, whatever ``trainer_procs`` is: the step's per-rank batches
are whitened together (one mean and std over the whole step) and the critic makes one
optimizer update on all of them (its gradient the one of the whole step's value loss, its
schedule advancing once), as a single-rank run would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forge.losses.value import ppo_advantages_for_batch, turn_gae_advantages, whiten_together
from forge.training.value_model import CriticConfig
from forge.types import TrainBatch

if TYPE_CHECKING:
    from forge.actors.critic import Critic
    from forge.actors.trainer import Trainer

__all__ = ["PPO_LOSSES", "GAECritic", "check_ppo", "train_step"]

PPO_LOSSES = ("ppo", "reinforce")


def check_ppo(critic: CriticConfig | None, loss_type: str) -> None:
    """Config check: a critic needs a loss that takes per-token advantages."""
    if critic is not None and loss_type not in PPO_LOSSES and ":" not in loss_type:
        raise ValueError(
            f"critic is set, so the advantages are per token (GAE), but trainer.loss.type="
            f"{loss_type!r} takes one advantage per sequence; use one of {PPO_LOSSES}"
        )


@dataclass
class GAECritic:
    """A running critic actor (``forge.actors.Critic``) with its config: GAE advantages for
    a batch, then the critic's update."""

    actor: Critic
    cfg: CriticConfig
    whiten: bool = True  # normalise GAE advantages per batch

    async def advantages(self, batches: list[TrainBatch]) -> list[tuple[Any, Any]]:
        """Set GAE advantages on each rank's batch (whitened over all of them together);
        returns ``[(returns_bt, values_bt)]``."""
        values = await asyncio.gather(*(self.actor.values.call_one(b) for b in batches))
        targets, advantages = [], []
        for b, values_bt in zip(batches, values):
            if self.cfg.level == "turn":
                adv_bt, returns_bt = self.turn_advantages(b, values_bt)
            else:
                adv_bt, returns_bt = ppo_advantages_for_batch(
                    b, b.rewards_b, values_bt, self.cfg.gamma, self.cfg.lam
                )
            advantages.append(adv_bt)
            targets.append((returns_bt, values_bt))
        if self.whiten:
            masks = [b.response_mask_bt for b in batches]
            advantages = whiten_together(advantages, masks)
        for b, adv_bt in zip(batches, advantages):
            b.advantages_b = adv_bt
        return targets

    def turn_advantages(self, b: TrainBatch, values_bt) -> tuple[Any, Any]:
        """PPO over turns: GAE at turn boundaries from the episodes' per-turn rewards
        (not whitened: ``advantages`` whitens the whole step)."""
        if b.turn_rewards is None:
            raise ValueError(
                "critic.level=turn needs per-turn rewards on every episode; they come from "
                "multi-turn rollouts (an env section)"
            )
        mask_bt = b.response_mask_bt
        at_b = b.bootstrap_at_b if self.cfg.bootstrap_truncated else None
        return turn_gae_advantages(
            b.turn_rewards,
            values_bt.to(mask_bt.device),
            mask_bt,
            self.cfg.gamma,
            self.cfg.lam,
            at_b,
            b.row_episode_b,
        )

    async def train(self, batches: list[TrainBatch], targets) -> dict[str, float]:
        """One critic update on all the step's rank batches together; its metrics, prefixed."""
        returns = [r for r, _ in targets]
        olds = [v for _, v in targets]
        m = await self.actor.train_step.call_one(list(batches), returns, olds)
        return {f"critic/{k}": v for k, v in m.items()}


async def train_step(
    trainer: Trainer, batch: list[TrainBatch], critic: GAECritic | None = None
) -> dict:
    """One training step on ``batch`` (a list of per-rank batches); with a critic (PPO):
    values -> GAE -> the policy and critic updates side by side."""
    if critic is None:
        return (await trainer.train_step.call(batch)).item(procs=0)
    targets = await critic.advantages(batch)
    trained, cm = await asyncio.gather(trainer.train_step.call(batch), critic.train(batch, targets))
    return {**trained.item(procs=0), **cm}
