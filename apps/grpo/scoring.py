"""One GRPO group, end to end: prompt -> completions -> reward components -> scalar rewards
-> advantages -> episodes (with reference logprobs when a reference model is used).

``RolloutConfig`` holds the knobs of the rollout side; ``GroupScorer.produce`` is the
``produce`` callable of ``forge.rollout.RolloutManager``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from forge.plugins import Spec
from forge.rewards import length_penalty
from forge.rewards.vector import component_means
from forge.rollout import group_episodes
from forge.slots import ADVANTAGE, GROUP_FILTER, REWARD_AGGREGATOR
from forge.types import Episode


@dataclass
class RolloutConfig:
    """How groups are generated, scored and filtered.

    ``filter``: keep a group or try another prompt (``nonzero_variance``: DAPO's dynamic
    sampling; ``keep_all``), within ``over_sampling_factor`` times the groups a step needs.
    ``partial``: groups in flight across a weight update are kept (bounded by the policy
    age limit) rather than dropped. ``overlong_buffer``: DAPO's soft overlong penalty, a
    reward component ``overlong`` falling linearly from 0 at ``max_tokens - overlong_buffer``
    tokens to ``-overlong_penalty`` at ``max_tokens`` (0 disables it).
    """

    prompts_per_step: int = 16  # groups per training step
    group_size: int = 8
    max_tokens: int = 8
    temperature: float = 1.0
    tasks: int = 4  # concurrent rollout loops
    filter: Spec = "keep_all"
    over_sampling_factor: float = 1.0
    partial: bool = True
    reward_aggregator: Spec = "weighted_sum"
    advantage: Spec = "grpo"
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0

    def __post_init__(self) -> None:
        GROUP_FILTER.validate(self.filter, key="rollout.filter")
        REWARD_AGGREGATOR.validate(self.reward_aggregator, key="rollout.reward_aggregator")
        ADVANTAGE.validate(self.advantage, key="rollout.advantage")
        if self.over_sampling_factor < 1.0:
            raise ValueError(
                f"rollout.over_sampling_factor must be >= 1, got {self.over_sampling_factor}"
            )
        if not 0 <= self.overlong_buffer < self.max_tokens:
            raise ValueError(
                f"rollout.overlong_buffer must be in [0, max_tokens={self.max_tokens}), got "
                f"{self.overlong_buffer}"
            )


class GroupScorer:
    """Makes one scored group per ``produce()`` call from the run's services."""

    def __init__(
        self, cfg: RolloutConfig, data, generator, rewards, reference, log, reward_model=None
    ) -> None:
        self.cfg, self.data, self.generator = cfg, data, generator
        self.rewards, self.reference, self.log = rewards, reference, log
        self.reward_model = reward_model  # a learned scorer: one more reward component
        self.aggregate = REWARD_AGGREGATOR.resolve(cfg.reward_aggregator)
        self.advantage = ADVANTAGE.resolve(cfg.advantage)

    async def produce(self) -> list[Episode]:
        c = self.cfg
        item = await self.data.sample.call_one()
        completions = await self.generator.generate.route(
            item["prompt"], n=c.group_size, max_tokens=c.max_tokens, temperature=c.temperature
        )
        items = [(item["prompt"], x.text, item["target"]) for x in completions]
        sources = [self.rewards] + ([self.reward_model] if self.reward_model else [])
        results = await asyncio.gather(*(src.evaluate_batch.route(items) for src in sources))
        components = [{} for _ in completions]
        for scored in results:
            for comp, s in zip(components, scored):
                comp.update(s.components)
        if c.overlong_buffer:
            soft = c.max_tokens - c.overlong_buffer
            for comp, x in zip(components, completions):
                comp["overlong"] = length_penalty(
                    len(x.token_ids), soft, c.max_tokens, c.overlong_penalty
                )
        totals = [float(t) for t in self.aggregate(components)]
        group = group_episodes(completions, totals, item["target"], self.advantage, components)
        self.log_group(totals, components)
        await self.add_reference(group)
        return group

    def log_group(self, totals: list[float], components: list[dict[str, float]]) -> None:
        """Per-step means: the scalar reward, each named component, zero-variance groups."""
        self.log.add("rollout/reward", totals)
        for key, value in component_means(components).items():
            self.log.add(f"rollout/reward/{key}", [value])
        self.log.add("rollout/zero_variance_groups", [float(len(set(totals)) == 1)])

    async def add_reference(self, group: list[Episode]) -> None:
        """The reference model's logprobs of each episode's response (for the KL term)."""
        if self.reference is not None:
            refs = await self.reference.forward.route(group)
            for e, r in zip(group, refs):
                e.ref_logprobs = r


def check_rollout_overrides(phases) -> None:
    """Every ``phases[i].rollout`` key must be a ``RolloutConfig`` field, with a valid value."""
    names = [f.name for f in dataclasses.fields(RolloutConfig)]
    cfg = RolloutConfig()
    for i, phase in enumerate(phases):
        unknown = sorted(set(phase.rollout) - set(names))
        if unknown:
            raise ValueError(
                f"phases[{i}].rollout: unknown key(s) {unknown}; RolloutConfig has {names}"
            )
        try:
            cfg = dataclasses.replace(cfg, **phase.rollout)
        except (TypeError, ValueError) as e:
            raise ValueError(f"phases[{i}].rollout: {e}") from None


def apply_rollout_overrides(
    base: RolloutConfig, overrides: dict[str, Any], scorer: GroupScorer, manager
) -> RolloutConfig:
    """A phase's rollout settings, applied to the running scorer and rollout manager."""
    cfg = dataclasses.replace(base, **overrides)
    scorer.cfg = cfg
    scorer.aggregate = REWARD_AGGREGATOR.resolve(cfg.reward_aggregator)
    scorer.advantage = ADVANTAGE.resolve(cfg.advantage)
    manager.filter_fn = GROUP_FILTER.resolve(cfg.filter)
    manager.partial = cfg.partial
    manager.budget = int(cfg.over_sampling_factor * manager.groups_per_step + 0.999999)
    return cfg
