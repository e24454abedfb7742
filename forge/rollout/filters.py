"""Group filters: ``filter_fn(group: list[Episode]) -> bool``, True to keep the group.

DAPO's dynamic sampling keeps only groups whose rewards differ (``nonzero_variance``): a
group that is all right or all wrong has zero advantage everywhere and teaches nothing.
"""

from __future__ import annotations

from forge.types import Episode

__all__ = ["keep_all", "nonzero_variance"]


def nonzero_variance(group: list[Episode]) -> bool:
    """Keep groups whose rewards are not all equal."""
    return len({round(e.reward, 9) for e in group}) > 1


def keep_all(group: list[Episode]) -> bool:
    """Keep every group (no filtering)."""
    return True
