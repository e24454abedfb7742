"""PPO's value side for the GRPO app: a critic gives per-token values, GAE turns the batch's
terminal rewards into per-token advantages, and the critic trains on the returns.

    values -> GAE(gamma, lambda) -> batch.advantages_b = A[B, T] -> trainer (loss type ppo)
                                 -> critic.train_step(batch, returns, old values)

Enabled by a ``critic`` section in the config (``forge.training.critic.CriticConfig``); the
trainer's loss must then take per-token advantages (``ppo`` or ``reinforce``).
"""

from __future__ import annotations

import asyncio

from forge.losses.value import ppo_advantages_for_batch
from forge.training.critic import CriticConfig
from forge.types import TrainBatch

PPO_LOSSES = ("ppo", "reinforce")


def check_ppo(critic: CriticConfig | None, loss_type: str) -> None:
    """A critic needs a loss that takes per-token advantages."""
    if critic is not None and loss_type not in PPO_LOSSES and ":" not in loss_type:
        raise ValueError(
            f"critic is set, so the advantages are per token (GAE), but trainer.loss.type="
            f"{loss_type!r} takes one advantage per sequence; use one of {PPO_LOSSES}"
        )


async def value_advantages(critic, batches: list[TrainBatch], cfg: CriticConfig, whiten: bool):
    """Set GAE advantages on each rank's batch; returns ``[(returns_bt, values_bt)]``."""
    values = await asyncio.gather(*(critic.values.call_one(b) for b in batches))
    targets = []
    for b, values_bt in zip(batches, values):
        adv_bt, returns_bt = ppo_advantages_for_batch(
            b, b.rewards_b, values_bt, cfg.gamma, cfg.lam, whiten_advantages=whiten
        )
        b.advantages_b = adv_bt
        targets.append((returns_bt, values_bt))
    return targets


async def train_critic(critic, batches: list[TrainBatch], targets) -> dict[str, float]:
    """One critic update per rank batch; returns the last update's metrics, prefixed."""
    m: dict[str, float] = {}
    for b, (returns_bt, values_bt) in zip(batches, targets):
        m = await critic.train_step.call_one(b, returns_bt, values_bt)
    return {f"critic/{k}": v for k, v in m.items()}
