"""Rollouts: scored groups of episodes, group filters, and the loops that produce them."""

from forge.rollout.filters import keep_all, nonzero_variance
from forge.rollout.groups import group_episodes, heldout_accuracy
from forge.rollout.manager import RolloutManager

__all__ = ["RolloutManager", "group_episodes", "heldout_accuracy", "keep_all", "nonzero_variance"]
