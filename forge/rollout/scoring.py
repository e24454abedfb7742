"""One scored group, end to end: prompt -> completions -> reward components -> scalar rewards
-> advantages -> episodes (with reference logprobs when a reference model is used).

``RolloutConfig`` holds the knobs of the rollout side; ``GroupScorer.produce`` is the
``produce`` callable of ``forge.rollout.RolloutManager``::

    scorer = GroupScorer(cfg.rollout, temperature, data, generator, rewards, log=log)
    manager = RolloutManager(scorer.produce, buffer.add.call_one, **scorer.manager_kwargs())
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from forge.envs.messages import to_messages
from forge.observability.episode_log import episode_record
from forge.observability.names import M
from forge.plugins import PluginSpec, Spec
from forge.rewards import RewardResult, RewardTimeoutError, length_penalty
from forge.rewards.vector import component_means
from forge.rollout.groups import group_episodes
from forge.slots import ADVANTAGE, CREDIT, GROUP_FILTER, REWARD_AGGREGATOR
from forge.types import Episode

__all__ = [
    "GroupScorer",
    "RolloutConfig",
    "check_rollout_overrides",
    "per_episode",
    "per_member",
    "score_totals",
]


@dataclass
class RolloutConfig:
    """How groups are generated, scored and filtered (the sampling temperature is the
    policy's: ``policy.temperature``)."""

    prompts_per_step: int = 16
    """Groups (prompts) per training step."""
    group_size: int = 8
    """Completions sampled per prompt."""
    max_tokens: int = 8
    """Most tokens per completion (per turn with an environment)."""
    tasks: int = 4
    """Concurrent rollout loops."""
    filter: Spec = "keep_all"
    """Keep a group or try another prompt (``forge.slots.GROUP_FILTER``: ``keep_all``;
    ``nonzero_variance``: DAPO's dynamic sampling)."""
    over_sampling_factor: float = 1.0
    """Most groups tried per step, as a multiple of the groups it needs (with a filter)."""
    partial: bool = True
    """Groups in flight across a weight update are kept (bounded by the policy age limit)
    rather than dropped."""
    reward_aggregator: Spec = "weighted_sum"
    """How a completion's reward components become one reward
    (``forge.slots.REWARD_AGGREGATOR``)."""
    advantage: Spec = "grpo"
    """How a group's rewards become advantages (``forge.slots.ADVANTAGE``: ``grpo``,
    ``dr_grpo``, ``rloo``, ...)."""
    credit: Spec = "episode"
    """Multi-turn runs: how each turn of an episode is credited (``forge.slots.CREDIT``:
    ``episode``, ``turn_returns``, ``gigpo``, ``state_baseline``; ``forge.losses.turn_credit``);
    anything but ``episode`` gives per-token advantages."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty: falls linearly from 0 at ``max_tokens -
    overlong_buffer`` tokens to ``-overlong_penalty`` at ``max_tokens``, added to the
    aggregated reward (logged as the component ``overlong``; 0: off)."""
    overlong_penalty: float = 1.0
    """The overlong penalty at ``max_tokens`` (see ``overlong_buffer``)."""
    log_episodes: int = 8
    """Episodes of each step (whole groups first) written to ``<run_dir>/episodes.jsonl``
    for ``forge episodes RUN_DIR`` (0: none)."""
    reward_timeout_s: float = 600.0
    """The bound on scoring one group; past it the run stops with ``RewardTimeoutError``
    naming the service (a backstop: reward functions bound their own work)."""

    def __post_init__(self) -> None:
        GROUP_FILTER.validate(self.filter, key="rollout.filter")
        REWARD_AGGREGATOR.validate(self.reward_aggregator, key="rollout.reward_aggregator")
        ADVANTAGE.validate(self.advantage, key="rollout.advantage")
        CREDIT.validate(self.credit, key="rollout.credit")
        if self.over_sampling_factor < 1.0:
            raise ValueError(
                f"rollout.over_sampling_factor must be >= 1, got {self.over_sampling_factor}"
            )
        if not 0 <= self.overlong_buffer < self.max_tokens:
            raise ValueError(
                f"rollout.overlong_buffer must be in [0, max_tokens={self.max_tokens}), got "
                f"{self.overlong_buffer}"
            )
        if not self.reward_timeout_s > 0:
            raise ValueError(
                f"rollout.reward_timeout_s must be > 0 (seconds), got {self.reward_timeout_s}"
            )

    @property
    def episodes_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


def per_episode(credit: Spec) -> bool:
    """Whether ``rollout.credit`` is the built-in ``episode`` (one advantage per episode)."""
    return credit == "episode" or (isinstance(credit, PluginSpec) and credit.fn == "episode")


def per_member(aggregator: Spec) -> bool:
    """Whether the reward aggregator scores each member alone (``weighted_sum``), so that it
    can also combine one turn's named rewards."""
    from forge.rewards.vector import WeightedSum

    name = aggregator.fn if isinstance(aggregator, PluginSpec) else aggregator
    return name in ("weighted_sum", "forge.rewards.vector:WeightedSum") or isinstance(
        aggregator, WeightedSum
    )


def score_totals(
    aggregate, components: list[dict[str, float]], lengths: list[int], cfg: RolloutConfig
) -> list[float]:
    """The scalar reward of each member: ``aggregate`` of its reward components, plus the
    overlong penalty when ``cfg.overlong_buffer`` is set (also recorded in ``components`` as
    ``overlong``, for the logs).

    The penalty is added *after* aggregation. As one more component it would be mixed in by
    the aggregator: under ``minimum`` it is 0 for every response within length, so
    ``min(correct, 0) = 0`` whether the answer is right or wrong and only length is learned;
    under ``pareto`` it would be one more objective instead of a shaping term.
    """
    totals = [float(t) for t in aggregate(components)]
    if cfg.overlong_buffer:
        soft = cfg.max_tokens - cfg.overlong_buffer
        for i, (comp, n) in enumerate(zip(components, lengths)):
            penalty = length_penalty(n, soft, cfg.max_tokens, cfg.overlong_penalty)
            comp["overlong"] = penalty
            totals[i] += penalty
    return totals


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


class GroupScorer:
    """Makes one scored group per ``produce()`` call from the run's services: ``data``
    (a ``DatasetActor``), ``generator`` and ``rewards`` (services; ``rewards`` may be
    ``None`` when an environment gives every reward), and optionally a ``reference`` model
    service (logprobs for the KL term), a learned ``reward_model`` service (one more
    reward component) and a ``distill`` (``forge.rollout.distiller.Distiller``: a teacher's
    per-token advantages). ``log``: a ``MetricLog`` (per-step reward means)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        temperature: float,
        data,
        generator,
        rewards,
        *,
        log,
        reference=None,
        reward_model=None,
        distill=None,
    ) -> None:
        self.temperature = temperature
        self.data, self.generator, self.rewards = data, generator, rewards
        self.reference, self.reward_model, self.log = reference, reward_model, log
        self.distill = distill
        self.reconfigure(cfg)

    def reconfigure(self, cfg: RolloutConfig) -> None:
        """Use ``cfg`` from the next group on (a phase switch)."""
        self.cfg = cfg
        self.aggregate = REWARD_AGGREGATOR.resolve(cfg.reward_aggregator)
        self.advantage = ADVANTAGE.resolve(cfg.advantage)
        self.credit = None if per_episode(cfg.credit) else CREDIT.resolve(cfg.credit)

    def switch(self, overrides: dict[str, Any], manager) -> None:
        """A phase's rollout settings (``RolloutConfig`` fields), applied to this scorer and
        to the running ``RolloutManager``."""
        cfg = dataclasses.replace(self.cfg, **overrides)
        self.reconfigure(cfg)
        manager.reconfigure(
            filter_fn=GROUP_FILTER.resolve(cfg.filter, key="rollout.filter"),
            over_sampling_factor=cfg.over_sampling_factor,
            partial=cfg.partial,
        )

    def manager_kwargs(self, max_policy_age: int) -> dict[str, Any]:
        """The ``RolloutManager`` settings this config implies."""
        c = self.cfg
        return {
            "groups_per_step": c.prompts_per_step,
            "max_policy_age": max_policy_age,
            "concurrency": c.tasks,
            "filter_fn": GROUP_FILTER.resolve(c.filter, key="rollout.filter"),
            "over_sampling_factor": c.over_sampling_factor,
            "partial": c.partial,
            "record": self.log.add,
        }

    async def produce(self) -> list[Episode]:
        c = self.cfg
        item = await self.data.sample.call_one()
        completions = await self.generator.generate.route(
            item["prompt"], n=c.group_size, max_tokens=c.max_tokens, temperature=self.temperature
        )
        items = [(item["prompt"], x.text, item["target"]) for x in completions]
        sources = [s for s in (self.rewards, self.reward_model) if s is not None]
        results = await asyncio.gather(*(self.score(src, items) for src in sources))
        components = [{} for _ in completions]
        for scored in results:
            for comp, s in zip(components, scored):
                comp.update(s.components)
        lengths = [len(x.token_ids) for x in completions]
        self.log.add(M.TRUNCATED, [float(x.stop_reason == "length") for x in completions])
        totals = [0.0] * len(completions)  # pure distillation (a teacher, no reward): 0
        if sources:
            totals = score_totals(self.aggregate, components, lengths, c)
            self.log_group(totals, components)
        group = group_episodes(completions, totals, item["target"], self.advantage, components)
        await self.add_reference(group)
        if self.distill is not None:
            await self.distill(group, item, [x.text for x in completions], totals)
        prompt = _as_messages(item["prompt"])  # logged after the teacher: its logprobs too
        self.sample_episodes(
            group, [[*prompt, {"role": "assistant", "content": x.text}] for x in completions]
        )
        return group

    async def score(self, source, items: list[tuple]) -> list[RewardResult]:
        """``source.evaluate_batch`` (a reward service) on ``items`` within
        ``reward_timeout_s``; ``RewardTimeoutError`` past it."""
        bound = self.cfg.reward_timeout_s
        task = asyncio.ensure_future(source.evaluate_batch.route(items))
        done, _ = await asyncio.wait({task}, timeout=bound)
        if not done:
            task.cancel()
            raise RewardTimeoutError(
                f"{getattr(source, 'name', source)}.evaluate_batch did not score {len(items)} "
                f"responses within rollout.reward_timeout_s={bound} s; a reward function hangs "
                "on some input (bound it, e.g. MathReward's timeout_s) or needs a larger bound"
            )
        return task.result()

    def sample_episodes(self, group: list[Episode], messages: list[list[dict]], turns=None) -> None:
        """Keep the group's episodes (their conversations: ``messages``) for the step's
        sample in ``episodes.jsonl`` while it has room (``rollout.log_episodes``)."""
        samples = getattr(self.log, "episodes", None)
        if samples is None or not samples.room(self.cfg.log_episodes):
            return
        turns = turns or [1] * len(group)
        samples.add([episode_record(e, m, n) for e, m, n in zip(group, messages, turns)])

    def log_group(self, totals: list[float], components: list[dict[str, float]]) -> None:
        """Per-step means: the scalar reward, each named component, zero-variance groups."""
        self.log.add(M.REWARD, totals)
        for key, value in component_means(components).items():
            self.log.add(M.reward(key), [value])
        self.log.add(M.ZERO_VARIANCE_GROUPS, [float(len(set(totals)) == 1)])

    async def add_reference(self, group: list[Episode]) -> None:
        """The reference model's logprobs of each episode's response (for the KL term)."""
        if self.reference is not None:
            refs = await self.reference.forward.route(group)
            for e, r in zip(group, refs):
                e.ref_logprobs = r


def _as_messages(prompt: Any) -> list[dict]:
    """A prompt (text, chat messages or token ids) as chat messages, for the episode log."""
    try:
        return to_messages(prompt)
    except TypeError:
        return [{"role": "user", "content": str(prompt)}]
