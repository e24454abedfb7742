"""The ``RewardModel`` actor: a learned reward model (sequence classifier) behind endpoints.

Usually a service (replicas behind a router), next to or instead of a ``RewardActor``::

    rm = await RewardModel.options(num_replicas=2).as_service(RewardModelConfig(model=path))
    results = await rm.evaluate_batch.route([(prompt, response, target), ...])
    scores = await rm.score.route([(prompt, response), ...])

or as a plain actor (``as_actor``, ``call_one``). The scoring itself is
``forge.models.reward_classifier.RewardModelCore``; no gradients, eval mode.

Endpoints:

``setup()``
    Run by the runtime at spawn: loads the model and tokenizer (``RewardModelConfig``).
``score(pairs) -> list[float]``
    One score per ``(prompt, response)`` pair, in order.
``evaluate_batch(items) -> list[RewardResult]``
    For ``(prompt, response, target)`` tuples, the same interface as
    ``RewardActor.evaluate_batch``: ``RewardResult(total=s, components={cfg.name: s})`` with
    ``s`` the pair's score (``target`` is ignored: the model judges the response alone), so
    it drops in as a reward source next to rule-based rewards.

Both are plain ``def`` endpoints: they run in the actor's worker thread, off its event loop.
Each call records ``reward_model/pairs`` (sum) and ``reward_model/score`` (mean) for
``flush_metrics``.
"""

from __future__ import annotations

from typing import Any

from controller import endpoint
from forge.actors.forge_actor import MODEL_PRELOAD, ForgeActor, actor_config
from forge.models.reward_classifier import RewardModelConfig
from forge.observability import Reduce, record_metric
from forge.rewards import RewardResult

__all__ = ["RewardModel"]


class RewardModel(ForgeActor):
    """A learned reward model; see the module docstring for its endpoints."""

    _busy_name = "reward_model"
    preload = MODEL_PRELOAD

    def __init__(self, config: RewardModelConfig | dict) -> None:
        self.cfg = actor_config(RewardModelConfig, config, "RewardModel")
        self.core = None

    @endpoint
    def setup(self) -> None:
        from forge.models.reward_classifier import RewardModelCore

        self.core = RewardModelCore(self.cfg)

    @endpoint
    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        return self._score(pairs)

    @endpoint
    def evaluate_batch(self, items: list[tuple[str, str, Any]]) -> list[RewardResult]:
        pairs = []
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise TypeError(
                    f"evaluate_batch: item {i} is {item!r}; each item must be a "
                    "(prompt, response, target) tuple"
                )
            pairs.append((item[0], item[1]))
        scores = self._score(pairs)
        return [RewardResult(total=s, components={self.cfg.name: s}) for s in scores]

    def _score(self, pairs: list[tuple[str, str]]) -> list[float]:
        with self.busy():
            scores = self.core.score(pairs)
        record_metric("reward_model/pairs", len(scores), Reduce.SUM)
        for s in scores:
            record_metric("reward_model/score", s, Reduce.MEAN)
        return scores
