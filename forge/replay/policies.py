"""Pluggable choices of the replay buffer: which episodes a sample takes, which the size cap drops.

Both kinds of policy see the buffer's usable episodes as a list in insertion order (oldest
first) and return *positions* into that list, so they never touch the episodes themselves and
the buffer keeps all bookkeeping (resample counts, metrics) in one place.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from forge.types import Episode

__all__ = [
    "EVICTION_POLICIES",
    "SAMPLE_POLICIES",
    "EvictionPolicy",
    "FifoEvictionPolicy",
    "FifoSamplePolicy",
    "NewestSamplePolicy",
    "SamplePolicy",
    "UniformSamplePolicy",
    "build_eviction_policy",
    "build_sample_policy",
]


class SamplePolicy:
    """Chooses which ``k`` distinct episodes one call to ``sample`` returns."""

    name: str = ""

    def select(self, episodes: Sequence[Episode], k: int, rng: random.Random) -> list[int]:
        """Return ``k`` distinct positions into ``episodes`` (oldest first), in batch order.

        ``rng`` is the buffer's own generator; a policy must draw randomness only from it so
        the buffer's ``state_dict`` round trip reproduces future samples.
        """
        raise NotImplementedError


class UniformSamplePolicy(SamplePolicy):
    """Uniformly random, without replacement."""

    name = "uniform"

    def select(self, episodes: Sequence[Episode], k: int, rng: random.Random) -> list[int]:
        return rng.sample(range(len(episodes)), k)


class FifoSamplePolicy(SamplePolicy):
    """Oldest first: the ``k`` episodes that have waited longest (least off-policy drift)."""

    name = "fifo"

    def select(self, episodes: Sequence[Episode], k: int, rng: random.Random) -> list[int]:
        return list(range(k))


class NewestSamplePolicy(SamplePolicy):
    """Newest first: the ``k`` most recently added episodes, newest at the front."""

    name = "newest"

    def select(self, episodes: Sequence[Episode], k: int, rng: random.Random) -> list[int]:
        n = len(episodes)
        return list(range(n - 1, n - 1 - k, -1))


class EvictionPolicy:
    """Chooses which episodes to drop when the buffer is over ``max_buffer_size``."""

    name: str = ""

    def select(self, episodes: Sequence[Episode], n_drop: int) -> list[int]:
        """Return ``n_drop`` distinct positions into ``episodes`` (oldest first) to drop."""
        raise NotImplementedError


class FifoEvictionPolicy(EvictionPolicy):
    """Drop the oldest episodes first."""

    name = "fifo"

    def select(self, episodes: Sequence[Episode], n_drop: int) -> list[int]:
        return list(range(n_drop))


SAMPLE_POLICIES: dict[str, type[SamplePolicy]] = {
    cls.name: cls for cls in (UniformSamplePolicy, FifoSamplePolicy, NewestSamplePolicy)
}
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (FifoEvictionPolicy,)
}


def build_sample_policy(name: str) -> SamplePolicy:
    """Return a fresh sample policy for ``name`` (``uniform``, ``fifo`` or ``newest``)."""
    if name not in SAMPLE_POLICIES:
        raise ValueError(f"unknown sample policy {name!r}; choose one of {sorted(SAMPLE_POLICIES)}")
    return SAMPLE_POLICIES[name]()


def build_eviction_policy(name: str) -> EvictionPolicy:
    """Return a fresh eviction policy for ``name`` (``fifo``)."""
    if name not in EVICTION_POLICIES:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {sorted(EVICTION_POLICIES)}"
        )
    return EVICTION_POLICIES[name]()
