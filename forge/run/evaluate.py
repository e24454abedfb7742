"""Evaluation of the policy during a run, on the run's generator service (rollouts go on).

The run's own held-out items: single-turn, the exact reward of each greedy answer
(``eval/heldout_accuracy``); multi-turn, greedy episodes in the environment, their success
rate and mean turns. Then each named set of ``eval.sets`` (``forge.evaluation``):
``eval/<name>/pass@k``, ``eval/<name>/reward``... in the same row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from forge.evaluation.harness import Defaults, evaluate_set
from forge.observability.names import M
from forge.rollout.episodes import EpisodeScorer, heldout_success
from forge.rollout.groups import accuracy_of, greedy_completions

__all__ = ["Evaluator", "evaluate_policy"]


async def evaluate_policy(
    scorer,
    generator,
    heldout: list[dict],
    reward_fn: Callable | None,
    max_tokens: int,
    keep: list | None = None,
) -> dict[str, float]:
    """The evaluation's metrics: ``M.HELDOUT_ACCURACY`` (success rate with an environment)
    and, for episodes, ``M.MEAN_TURNS``. ``scorer``: the run's ``GroupScorer`` or
    ``EpisodeScorer`` (episodes run through the latter's environment). Single-turn, the
    greedy completions are put in ``keep`` (if given) for sets that score the same answers."""
    if isinstance(scorer, EpisodeScorer):
        m = await heldout_success(scorer, heldout, max_tokens)
        return {M.HELDOUT_ACCURACY: m["success_rate"], M.MEAN_TURNS: m["mean_turns"]}
    completions = await greedy_completions(generator.generate.route, heldout, max_tokens)
    if keep is not None:
        keep[:] = completions
    return {M.HELDOUT_ACCURACY: accuracy_of(heldout, completions, reward_fn)}  # pyright: ignore[reportArgumentType]  # None only with an env


class Evaluator:
    """A run's evaluations: ``await evaluator(step)`` waits for ``before`` (e.g. the weight
    load in flight), evaluates, logs the metrics as a row of ``log`` and keeps the score in
    ``scores`` (``{step: held-out accuracy or success rate}``). ``sets``: named evaluation
    sets (``forge.evaluation.EvalSet``) evaluated after the held-out items; ``defaults``
    what they leave out (``forge.evaluation.Defaults``); ``tokenizer`` plays their
    episodes."""

    def __init__(
        self,
        scorer,
        generator,
        heldout,
        reward_fn,
        max_tokens,
        log,
        before=None,
        sets=(),
        defaults: Defaults | None = None,
        tokenizer: Any = None,
    ):
        self.scorer, self.generator, self.heldout = scorer, generator, heldout
        self.reward_fn, self.max_tokens, self.log, self.before = reward_fn, max_tokens, log, before
        self.sets, self.defaults, self.tokenizer = list(sets), defaults or Defaults(), tokenizer
        self.scores: dict[int, float] = {}

    @staticmethod
    def of_run(cfg, scorer, generator, heldout: list[dict], log, before=None) -> Evaluator:
        """The evaluator of an RL run config (``forge.run.rl_config.RLConfig``)."""
        reward = cfg.eval_reward_fn()
        defaults = Defaults(heldout, [reward] if reward else [], cfg.env, cfg.eval.max_tokens)
        tokenizer = getattr(scorer, "tokenizer", None)
        if tokenizer is None and any(s.env is not None for s in cfg.eval.sets):
            from forge.models import load_tokenizer

            tokenizer = load_tokenizer(cfg.policy.model)
        return Evaluator(
            scorer,
            generator,
            heldout,
            reward,
            cfg.eval.max_tokens,
            log,
            before,
            cfg.eval.sets,
            defaults,
            tokenizer,
        )

    async def __call__(self, step: int) -> float:
        if self.before is not None:
            await self.before()
        greedy: list = []
        metrics = await evaluate_policy(
            self.scorer, self.generator, self.heldout, self.reward_fn, self.max_tokens, greedy
        )
        defaults = replace(self.defaults, greedy=greedy or None)
        for es in self.sets:
            m = await evaluate_set(es, self.generator, self.tokenizer, defaults)
            metrics.update({f"eval/{es.name}/{k}": v for k, v in m.items()})
        self.log.record(step, metrics)
        self.scores[step] = metrics[M.HELDOUT_ACCURACY]
        return self.scores[step]
