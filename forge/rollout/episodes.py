"""Multi-turn groups: G episodes of one task in an environment.

With an ``env`` section a run's rollouts are episodes (``forge.envs.run_episode``): each
turn generated on the generator service inside one session (so a replica keeps the
conversation), each action answered by the environment (in this process, or by an
``EnvActor`` service with ``replicas.env`` replicas), tools executed when the model calls
them. A group is ``group_size`` episodes of one task; their rewards (or named reward
components) are aggregated and turned into advantages like single-turn completions, and the
loss counts only the tokens the policy sampled. ``rollout.credit`` other than ``episode``
then gives each turn its own advantage (``forge.rollout.token_credit``).

An episode whose environment fails (raises, times out, or its replica dies) is played again
from the start, on another replica when there are several, up to ``env.retries`` times; then
it is dropped and counted (``env/dropped_episodes``), and so is its group.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from forge.envs import Trajectory, run_episode
from forge.envs.tool_specs import ToolSpec, build_tools
from forge.envs.window import HistoryWindow
from forge.observability.names import M
from forge.plugins import Spec
from forge.rewards.vector import pad_components
from forge.rollout.groups import group_episodes
from forge.rollout.token_credit import assign_credit, sampled_turn_rewards
from forge.slots import ENVIRONMENT
from forge.types import Completion, Episode

__all__ = ["EnvConfig", "EpisodeScorer", "build_tools", "episode_components", "heldout_success"]


@dataclass
class EnvConfig:
    """The environment of a multi-turn run. Where it runs is the run's ``replicas.env``: 0 in
    the rollout loop's own process (cheap environments), N > 0 in an ``EnvActor`` service of
    N replicas, one episode per session."""

    fn: Spec
    """The environment (``forge.slots.ENVIRONMENT``: a class or factory, built fresh per
    episode)."""
    tools: list[str | ToolSpec] = field(default_factory=list)
    """Callables the model may call (``forge.envs.tool_specs``): import strings of plain
    functions (their schema from their type hints) or of ``forge.envs.Tool`` objects,
    ``{name, fn, schema}`` mappings, or ``python``, the sandboxed Python tool."""
    advertise_tools: bool = True
    """List the tools in the prompt (``false`` for a model that learned them in SFT and
    whose context is too short for the listing)."""
    max_turns: int = 8
    """Most turns per episode."""
    max_context_tokens: int = 1024
    """Most tokens of an episode's conversation."""
    step_timeout_s: float = 30.0
    """The bound on one environment step."""
    retries: int = 2
    """Replays of an episode whose environment failed."""
    history: HistoryWindow | None = None
    """Prompt each turn with a window of the game (``forge.envs.window``: the last
    ``turns`` turns with their answers; each turn its own training row) instead of the whole
    conversation (``null``)."""

    def __post_init__(self) -> None:
        ENVIRONMENT.validate(self.fn, key="env.fn")
        build_tools(self.tools)
        if self.retries < 0 or self.max_turns < 1:
            raise ValueError(
                f"env: retries must be >= 0 and max_turns >= 1, got {self.retries}, "
                f"{self.max_turns}"
            )


class EpisodeScorer:
    """Makes one scored group of episodes per ``produce()`` call. ``scorer``: the run's
    single-turn ``GroupScorer`` (its config, services, aggregation and advantages);
    ``envs``: an ``EnvActor`` service, or ``None`` to run environments in this process.
    ``bootstrap``: episodes cut by ``max_turns`` keep the environment's last answer and mark
    where a critic reads the value of the state after them (``Episode.bootstrap_at``)."""

    def __init__(self, scorer, env_cfg: EnvConfig, envs, tokenizer, bootstrap: bool = False):
        self.base, self.bootstrap = scorer, bootstrap
        self.env_cfg, self.envs, self.tokenizer = env_cfg, envs, tokenizer
        self.make_env = ENVIRONMENT.resolve(env_cfg.fn)
        self.tools = build_tools(env_cfg.tools, env_cfg.advertise_tools)

    def switch(self, overrides: dict, manager) -> None:
        """A phase's rollout settings (see ``GroupScorer.switch``)."""
        self.base.switch(overrides, manager)

    def manager_kwargs(self, max_policy_age: int) -> dict:
        """The ``RolloutManager`` settings of the run's rollout config."""
        return self.base.manager_kwargs(max_policy_age)

    async def episode(self, task, *, temperature: float, max_tokens: int) -> Trajectory | None:
        """One episode (replayed on environment failure); ``None`` once retries are spent."""
        from forge.actors.env_actor import RemoteEnv

        c = self.env_cfg
        log = self.base.log
        for _ in range(c.retries + 1):
            env = RemoteEnv(self.envs) if self.envs is not None else self.make_env()
            async with self.base.generator.session():
                traj = await run_episode(
                    env,
                    task,
                    self.base.generator.generate.route,
                    self.tokenizer,
                    max_turns=c.max_turns,
                    max_context_tokens=c.max_context_tokens,
                    sampling={"max_tokens": max_tokens, "temperature": temperature},
                    tools=self.tools,
                    step_timeout_s=c.step_timeout_s,
                    final_observation=self.bootstrap,
                    history=c.history,
                )
            if traj.finish_reason != "env_error" and traj.turn_versions:
                return traj
            log.add(M.RETRIED_EPISODES, [1.0])
        log.add(M.DROPPED_EPISODES, [1.0])
        return None

    async def answer_components(self, task: dict, trajs: list[Trajectory]) -> list[dict]:
        """The run's reward functions (``rewards:`` next to ``env:``) on each episode's
        final answer: ``fn(prompt, last assistant message, target)``, where ``prompt`` is
        the task's ``prompt`` (else the first observation's text). Their components join
        the environment's (a name both give is an error)."""
        items = [(_prompt_of(task, t), _final_answer(t), task.get("target")) for t in trajs]
        scored = await self.base.score(self.base.rewards, items)  # bounded
        out = [dict(s.components) for s in scored]
        for t, extra in zip(trajs, out):
            clash = sorted(set(extra) & set(t.reward_components))
            if clash:
                raise ValueError(
                    f"rewards: the reward functions and the environment both give {clash}; "
                    "rename one (a component is one number per episode)"
                )
        return out

    def mark_final_state(self, e: Episode) -> None:
        """One more (masked) token after a truncated episode's last observation: the critic's
        value at that position is the value of the state the episode was cut in."""
        e.response_ids.append(_pad_id(self.tokenizer))
        e.behavior_logprobs.append(0.0)
        e.loss_mask.append(0)
        if e.token_advantages is not None:
            e.token_advantages.append(0.0)
        e.bootstrap_at = e.num_tokens - 1

    async def produce(self) -> list[Episode] | None:
        r, temperature = self.base.cfg, self.base.temperature
        task = await self.base.data.sample.call_one()
        trajs = await asyncio.gather(
            *(
                self.episode(task, temperature=temperature, max_tokens=r.max_tokens)
                for _ in range(r.group_size)
            )
        )
        if any(t is None for t in trajs):
            self.base.log.add(M.DROPPED_GROUPS, [1.0])
            return None  # the manager gives the credit back and tries another task
        components = episode_components(trajs)
        if self.base.rewards is not None:  # reward functions score the final answers too
            for comp, extra in zip(components, await self.answer_components(task, trajs)):
                comp.update(extra)
        totals = [float(t) for t in self.base.aggregate(components)]
        group = group_episodes(
            [_as_completion(t) for t in trajs],
            totals,
            task.get("target"),
            self.base.advantage,
            components,
        )
        for e, t in zip(group, trajs):
            e.policy_version = t.oldest_version  # aged by its stalest turn
            e.loss_mask = t.loss_mask[t.prompt_length :]
            e.stop_reason = t.finish_reason
            e.turn_rewards = sampled_turn_rewards(t, self.base.aggregate)
            e.row_starts = [s - t.prompt_length for s in t.row_starts] or None
        if self.base.credit is not None:  # per-turn advantages (rollout.credit)
            assign_credit(group, trajs, self.base.credit, self.base.aggregate, self.base.log)
        for e, t in zip(group, trajs):
            if "final_state_at" in t.info:
                self.mark_final_state(e)
        self.base.log_group(totals, components)
        self.base.sample_episodes(group, [t.messages for t in trajs], [t.num_turns for t in trajs])
        self.base.log.add(M.TURNS, [float(t.num_turns) for t in trajs])
        await self.base.add_reference(group)
        return group


def _prompt_of(task: Any, t: Trajectory) -> str:
    if isinstance(task, dict) and isinstance(task.get("prompt"), str):
        return task["prompt"]
    first = next((m for m in t.messages if m.get("role") == "user"), {})
    return str(first.get("content", ""))


def _final_answer(t: Trajectory) -> str:
    """The text of the episode's last assistant message ("" if it never spoke)."""
    said = [m for m in t.messages if m.get("role") == "assistant"]
    return str(said[-1].get("content", "")) if said else ""


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def episode_components(trajs: list[Trajectory]) -> list[dict[str, float]]:
    """Each episode's named rewards, the same names for all (missing ones are 0): the
    environment's named components, plus ``reward`` for its scalar rewards."""
    comps = []
    for t in trajs:
        c = dict(t.reward_components)
        if t.reward != 0.0 or not c:
            c["reward"] = t.reward
        comps.append(c)
    return pad_components(comps)


def _as_completion(t: Trajectory) -> Completion:
    """The episode in the shape ``group_episodes`` takes (prompt, then everything after)."""
    p = t.prompt_length
    return Completion(
        prompt="",
        prompt_ids=t.token_ids[:p],
        token_ids=t.token_ids[p:],
        logprobs=t.logprobs[p:],
        text="",
        stop_reason=t.finish_reason,
        generator_version=t.oldest_version,
    )


async def heldout_success(scorer: EpisodeScorer, tasks: list[dict], max_tokens: int) -> dict:
    """Greedy episodes on held-out tasks: success rate (the ``success`` reward component if
    the environment reports one, else reward > 0) and mean turns."""
    trajs = await asyncio.gather(
        *(
            scorer.episode(
                {**t, "task_id": uuid.uuid4().hex[:8]}, temperature=0.0, max_tokens=max_tokens
            )
            for t in tasks
        )
    )
    done = [t for t in trajs if t is not None]
    wins = [t.reward_components.get("success", float(t.reward > 0)) > 0 for t in done]
    return {
        "success_rate": sum(wins) / max(1, len(tasks)),
        "mean_turns": sum(t.num_turns for t in done) / max(1, len(done)),
    }
