"""Named evaluation sets: what to evaluate a policy on, with the same slots as training.

::

    eval:
      every: 25
      sets:
        - {name: heldout}                                  # the run's own held-out items
        - name: chain_sum
          data: {fn: reasoning_gym, kwargs: {name: chain_sum, heldout_size: 64}}
          rewards: [{fn: reasoning_gym, kwargs: {name: chain_sum}}]
          n: 4                                             # samples per task: pass@1..4
          k: [1, 4]
        - name: tictactoe
          data: {fn: apps.guess.task:Secrets}
          env: {fn: {fn: textarena, kwargs: {game: TicTacToe-v0}}, max_turns: 6}

A set without ``data`` uses the run's data source; without ``rewards`` and ``env`` it uses
the run's environment, or else its evaluation reward. Its tasks are the source's
``heldout()`` items (the first ``limit``, 0: all).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.plugins import Spec
from forge.rollout.episodes import EnvConfig
from forge.slots import DATA_SOURCE, REWARD

__all__ = ["EvalSet"]


@dataclass
class EvalSet:
    """One named evaluation set: ``n`` samples per task, pass@k for each ``k``."""

    name: str
    """The set's name (its metrics are logged under it)."""
    data: Spec | None = None
    """A data source whose held-out items are the tasks (``None``: the run's)."""
    rewards: list[Spec] = field(default_factory=list)
    """Reward functions that score the answers (neither these nor ``env``: the run's
    environment, or else its evaluation reward)."""
    env: EnvConfig | None = None
    """An environment to evaluate in (its episodes' success decides)."""
    n: int = 1
    """Samples per task (greedy when 1 and ``temperature`` is unset)."""
    k: list[int] = field(default_factory=lambda: [1])
    """pass@k is reported for each ``k`` <= ``n``."""
    temperature: float | None = None
    """Sampling temperature (``None``: greedy for ``n`` = 1, else 1.0)."""
    max_tokens: int | None = None
    """Tokens per completion or turn (``None``: the run's ``eval.max_tokens``)."""
    limit: int = 0
    """Evaluate the first this many held-out items (0: all)."""
    success_threshold: float = 1.0
    """Without a ``success`` reward component, a sample is correct when its reward is at
    least this (with one, when that component is > 0)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"eval set name {self.name!r}: give a non-empty name without '/'")
        if self.n < 1 or self.limit < 0:
            raise ValueError(f"eval set {self.name!r}: n must be >= 1 and limit >= 0")
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise ValueError(
                f"eval set {self.name!r}: k={bad} outside 1..n={self.n}; pass@k needs k <= n "
                "samples per task"
            )
        if self.rewards and self.env is not None:
            raise ValueError(
                f"eval set {self.name!r}: give rewards (single-turn) or env (episodes), not both"
            )
        if self.data is not None:
            DATA_SOURCE.validate(self.data, key=f"eval.sets[{self.name}].data")
        for i, spec in enumerate(self.rewards):
            REWARD.validate(spec, key=f"eval.sets[{self.name}].rewards[{i}]")

    @property
    def sampling_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if self.n == 1 else 1.0
