"""RL maths as pure torch functions: advantages, loss aggregation, KL, TIS, policy losses.

Tensors are named by shape: ``_bt`` is ``[batch, tokens]``, ``_b`` is ``[batch]``;
``mask_bt`` is 1.0 on the response tokens that count. ``build_loss(LossConfig(...))`` is the
entry point a trainer uses; the functions below it are public for tests and experiments.
"""

from forge.losses.advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_group_fraction,
)
from forge.losses.kl import KL_ESTIMATORS, kl_penalty
from forge.losses.loss_config import LOSS_TYPES, LossConfig, LossFn, build_loss
from forge.losses.normalize import AGGREGATION_MODES, aggregate, masked_mean
from forge.losses.policy_gradient import grpo_loss, gspo_loss, ppo_clip_loss, reinforce_loss
from forge.losses.tis import sequence_tis_weights, tis_weights

__all__ = [
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "LOSS_TYPES",
    "LossConfig",
    "LossFn",
    "aggregate",
    "build_loss",
    "dr_grpo_advantages",
    "grpo_advantages",
    "grpo_loss",
    "gspo_loss",
    "kl_penalty",
    "masked_mean",
    "ppo_clip_loss",
    "reinforce_loss",
    "rloo_advantages",
    "sequence_tis_weights",
    "tis_weights",
    "zero_variance_group_fraction",
]
