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
    """One named evaluation set.

    ``n`` samples per task (greedy when ``n`` is 1 and ``temperature`` is unset, else
    ``temperature`` or 1.0), pass@k for each ``k`` <= ``n``. A sample is correct when its
    ``success`` reward component is > 0, or (without one) when its reward is >=
    ``success_threshold``. ``max_tokens``: per completion or turn (default the run's
    ``eval.max_tokens``).
    """

    name: str
    data: Spec | None = None
    rewards: list[Spec] = field(default_factory=list)
    env: EnvConfig | None = None
    n: int = 1
    k: list[int] = field(default_factory=lambda: [1])
    temperature: float | None = None
    max_tokens: int | None = None
    limit: int = 0
    success_threshold: float = 1.0

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
