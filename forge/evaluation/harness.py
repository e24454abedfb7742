"""Evaluate a policy (behind a generator service) on named evaluation sets.

    metrics = await evaluate_set(es, generator, tokenizer, defaults)
    # {"tasks": 64, "samples": 256, "pass@1": 0.41, "pass@4": 0.73, "reward": 0.44,
    #  "reward/success": 0.41, "turns": 2.6, "finish/done": 0.9, "finish/max_turns": 0.1}

Single-turn sets sample ``n`` completions per task and score them with the set's reward
functions (their named components are averaged too); environment sets play ``n`` episodes
per task, each in one generator session. ``reward`` is the sum of the components (the
environment's named rewards, plus ``reward`` for its scalar ones), as training's default
``weighted_sum`` aggregates them. Everything is in flight at once, so requests
batch on the generator.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from forge.envs import run_episode
from forge.envs.tool_specs import build_tools
from forge.evaluation.sets import EvalSet
from forge.rewards import evaluate_rewards
from forge.rewards.vector import pad_components
from forge.rollout.episodes import episode_components
from forge.slots import DATA_SOURCE, ENVIRONMENT, REWARD

__all__ = ["Defaults", "evaluate_set", "pass_at_k", "scores_run_greedy"]


@dataclass
class Defaults:
    """What a set leaves out comes from the run: its held-out items, its evaluation reward
    functions, its environment and the evaluation's ``max_tokens``. ``greedy``: the greedy
    completions of ``heldout`` (in order) the run's own evaluation already made; a set that
    would sample exactly those (the run's items, one greedy sample, same ``max_tokens``)
    scores them instead of generating again."""

    heldout: list | None = None
    rewards: list = field(default_factory=list)
    env: Any = None
    max_tokens: int = 8
    greedy: list | None = None


def scores_run_greedy(es: EvalSet, defaults: Defaults) -> bool:
    """True if ``es`` samples exactly the run's greedy answers to its held-out items (single
    turn, the run's items, one greedy sample, the run's ``max_tokens``): it then scores
    ``defaults.greedy`` instead of generating again."""
    env = es.env if es.env is not None or es.rewards else defaults.env
    return (
        env is None
        and es.data is None
        and es.n == 1
        and es.sampling_temperature == 0
        and (es.max_tokens or defaults.max_tokens) == defaults.max_tokens
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with ``c`` correct of ``n`` samples (Chen et al.,
    2021): ``1 - C(n - c, k) / C(n, k)``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


async def evaluate_set(es: EvalSet, generator, tokenizer, defaults: Defaults) -> dict[str, float]:
    """``es``'s metrics for the policy ``generator`` serves (see the module docstring)."""
    if es.data is not None:
        tasks = list(DATA_SOURCE.resolve(es.data)().heldout())
    elif defaults.heldout is not None:
        tasks = list(defaults.heldout)
    else:
        raise ValueError(f"eval set {es.name!r} has no data and the run gives none")
    tasks = tasks[: es.limit] if es.limit else tasks
    if not tasks:
        raise ValueError(f"eval set {es.name!r}: its data source holds out no items")
    env = es.env if es.env is not None or es.rewards else defaults.env
    max_tokens = es.max_tokens or defaults.max_tokens
    if env is not None:
        samples = await _episodes(es, env, tasks, generator, tokenizer, max_tokens)
    else:
        fns = [REWARD.resolve(s) for s in es.rewards] if es.rewards else defaults.rewards
        if not fns:
            raise ValueError(f"eval set {es.name!r} has neither rewards nor env to score with")
        if defaults.greedy is not None and scores_run_greedy(
            es, defaults
        ):  # the run's own greedy answers to these items: score them, don't resample
            samples = [[_scored(fns, t, c)] for t, c in zip(tasks, defaults.greedy)]
        else:
            samples = await _completions(es, fns, tasks, generator, max_tokens)
    return _metrics(es, samples)


def _scored(fns, task: dict, c) -> dict:
    r = evaluate_rewards(fns, task["prompt"], c.text, task.get("target"))
    return {"components": dict(r.components), "reward": r.total, "finish": c.stop_reason}


async def _completions(es: EvalSet, fns, tasks, generator, max_tokens) -> list[list[dict]]:
    async def one(task: dict) -> list[dict]:
        outs = await generator.generate.route(
            task["prompt"], n=es.n, temperature=es.sampling_temperature, max_tokens=max_tokens
        )
        return [_scored(fns, task, c) for c in outs]

    return list(await asyncio.gather(*(one(t) for t in tasks)))


async def _episodes(es: EvalSet, env_cfg, tasks, generator, tokenizer, max_tokens):
    make_env, tools = ENVIRONMENT.resolve(env_cfg.fn), build_tools(env_cfg.tools)

    async def one(task: dict) -> dict:
        async with generator.session():
            t = await run_episode(
                make_env(),
                {**task, "task_id": uuid.uuid4().hex[:8]},
                generator.generate.route,
                tokenizer,
                max_turns=env_cfg.max_turns,
                max_context_tokens=env_cfg.max_context_tokens,
                tools=tools,
                sampling={"max_tokens": max_tokens, "temperature": es.sampling_temperature},
                step_timeout_s=env_cfg.step_timeout_s,
            )
        (comps,) = episode_components([t])  # named rewards, plus "reward" for scalar ones
        return {
            "components": comps,
            "reward": sum(comps.values()),
            "finish": t.finish_reason,
            "turns": t.num_turns,
        }

    async def task_samples(task: dict) -> list[dict]:
        return list(await asyncio.gather(*(one(task) for _ in range(es.n))))

    return list(await asyncio.gather(*(task_samples(t) for t in tasks)))


def _correct(es: EvalSet, s: dict) -> bool:
    if "success" in s["components"]:
        return s["components"]["success"] > 0
    return s["reward"] >= es.success_threshold


def _metrics(es: EvalSet, per_task: list[list[dict]]) -> dict[str, float]:
    flat = [s for samples in per_task for s in samples]
    out: dict[str, float] = {"tasks": float(len(per_task)), "samples": float(len(flat))}
    for k in sorted(set(es.k) | {1}):
        scores = [pass_at_k(len(s), sum(_correct(es, x) for x in s), k) for s in per_task]
        out[f"pass@{k}"] = sum(scores) / len(scores)
    out["reward"] = sum(s["reward"] for s in flat) / len(flat)
    comps = pad_components([s["components"] for s in flat])
    for name in sorted(comps[0]) if comps else []:
        out[f"reward/{name}"] = sum(c[name] for c in comps) / len(comps)
    if "turns" in flat[0]:
        out["turns"] = sum(s["turns"] for s in flat) / len(flat)
    for reason, count in sorted(Counter(s["finish"] for s in flat).items()):
        out[f"finish/{reason}"] = count / len(flat)
    return out
