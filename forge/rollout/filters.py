"""Group filters: ``filter_fn(group: list[Episode]) -> bool``, True to keep the group.

DAPO's dynamic sampling keeps only groups that carry a learning signal (``nonzero_variance``):
a group that is all right or all wrong has episode advantage 0 everywhere and teaches nothing,
unless credit over turns (``rollout.credit``: ``gigpo``, ``turn_returns``, ...) gave some of
its turns an advantage of their own, which the filter keeps.
"""

from __future__ import annotations

import torch

from forge.losses.advantages import zero_variance_group_fraction
from forge.types import Episode

__all__ = ["keep_all", "nonzero_variance"]


def nonzero_variance(group: list[Episode]) -> bool:
    """Keep groups whose rewards are not all equal (the advantages' test, relative to the
    rewards' scale: ``forge.losses.advantages``), or where any token has a nonzero per-token
    advantage (credit over turns: a step-level signal in a group of equal rewards)."""
    rewards = torch.tensor([e.reward for e in group], dtype=torch.float64)
    if zero_variance_group_fraction(rewards, len(group)) < 1.0:
        return True
    return any(a != 0 for e in group for a in e.token_advantages or ())


def keep_all(group: list[Episode]) -> bool:
    """Keep every group (no filtering)."""
    return True
