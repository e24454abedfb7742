"""Greedy evaluation of the policy on held-out items, on the run's generator service.

Single-turn: the exact reward of each greedy answer (``eval/heldout_accuracy``). Multi-turn:
greedy episodes in the environment, their success rate and mean turns.
"""

from __future__ import annotations

from collections.abc import Callable

from forge.observability.names import M
from forge.rollout.episodes import EpisodeScorer, heldout_success
from forge.rollout.groups import heldout_accuracy

__all__ = ["Evaluator", "evaluate_policy"]


async def evaluate_policy(
    scorer, generator, heldout: list[dict], reward_fn: Callable | None, max_tokens: int
) -> dict[str, float]:
    """The evaluation's metrics: ``M.HELDOUT_ACCURACY`` (success rate with an environment)
    and, for episodes, ``M.MEAN_TURNS``. ``scorer``: the run's ``GroupScorer`` or
    ``EpisodeScorer`` (episodes run through the latter's environment)."""
    if isinstance(scorer, EpisodeScorer):
        m = await heldout_success(scorer, heldout, max_tokens)
        return {M.HELDOUT_ACCURACY: m["success_rate"], M.MEAN_TURNS: m["mean_turns"]}
    acc = await heldout_accuracy(generator.generate.route, heldout, reward_fn, max_tokens)
    return {M.HELDOUT_ACCURACY: acc}


class Evaluator:
    """A run's evaluations: ``await evaluator(step)`` waits for ``before`` (e.g. the weight
    load in flight), evaluates, logs the metrics as a row of ``log`` and keeps the score in
    ``scores`` (``{step: held-out accuracy or success rate}``)."""

    def __init__(self, scorer, generator, heldout, reward_fn, max_tokens, log, before=None):
        self.scorer, self.generator, self.heldout = scorer, generator, heldout
        self.reward_fn, self.max_tokens, self.log, self.before = reward_fn, max_tokens, log, before
        self.scores: dict[int, float] = {}

    async def __call__(self, step: int) -> float:
        if self.before is not None:
            await self.before()
        metrics = await evaluate_policy(
            self.scorer, self.generator, self.heldout, self.reward_fn, self.max_tokens
        )
        self.log.record(step, metrics)
        self.scores[step] = metrics[M.HELDOUT_ACCURACY]
        return self.scores[step]
