"""RewardActor: scores responses with a list of reward functions (run as a service).

Endpoints (called with ``route`` on a service, or ``call_one`` on a single actor):

- ``evaluate_response(prompt, response, target) -> RewardResult``: the total (weighted sum by
  default, or a custom aggregator) and every component by name, kept for logging.
- ``evaluate_batch(items) -> list[RewardResult]`` for ``(prompt, response, target)`` tuples.

Both are plain ``def`` endpoints: they run in the actor's worker thread, off its event loop.
``evaluate_batch`` hands a function with a ``score_batch`` method (``MathReward``, which
scores in a time-bounded child process) the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from controller import endpoint
from forge.actors.forge_actor import ForgeActor
from forge.rewards import RewardResult, evaluate_rewards, evaluate_rewards_batch, reward_name


class RewardActor(ForgeActor):
    """Evaluates ``reward_fns`` ``(prompt, response, target) -> float``.

    Args:
        reward_fns: the reward functions (picklable callables; lambdas travel too).
        weights: one weight per function, or a dict by function name (default 1.0 each).
        aggregator: ``components -> total``; replaces the weighted sum.
    """

    def __init__(
        self,
        reward_fns: Sequence[Callable[[str, str, Any], float]],
        weights: Sequence[float] | dict[str, float] | None = None,
        aggregator: Callable[[dict[str, float]], float] | None = None,
    ):
        if not reward_fns:
            raise ValueError("RewardActor needs at least one reward function")
        self.reward_fns = list(reward_fns)
        self.weights = weights
        self.aggregator = aggregator

    @endpoint
    def evaluate_response(self, prompt: str, response: str, target: Any) -> RewardResult:
        return evaluate_rewards(
            self.reward_fns, prompt, response, target, self.weights, self.aggregator
        )

    @endpoint
    def evaluate_batch(self, items: list[tuple[str, str, Any]]) -> list[RewardResult]:
        return evaluate_rewards_batch(self.reward_fns, items, self.weights, self.aggregator)

    @endpoint
    def names(self) -> list[str]:
        return [reward_name(fn) for fn in self.reward_fns]
