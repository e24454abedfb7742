"""Turning scored completions into training episodes, and measuring held-out accuracy."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import torch

from forge.losses import grpo_advantages
from forge.types import Completion, Episode


def group_episodes(
    completions: list[Completion],
    rewards: list[float],
    target: Any = None,
    advantage_fn: Callable[[torch.Tensor, int], torch.Tensor] = grpo_advantages,
    components: list[dict[str, float]] | None = None,
) -> list[Episode]:
    """One group: the completions of one prompt with group-relative advantages.

    ``advantage_fn(rewards_b, group_size)`` is the estimator (GRPO's z-score by default; see
    ``forge.slots.ADVANTAGE``). Each episode keeps the generator's version (for the replay
    buffer's age limit), its behaviour logprobs (for the clipped ratio and TIS) and, when
    given, its reward components (``reward_breakdown``).
    """
    if len(completions) != len(rewards):
        raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
    adv_b = advantage_fn(torch.tensor(rewards, dtype=torch.float32), len(rewards))
    if tuple(adv_b.shape) != (len(rewards),):
        raise ValueError(
            f"advantage estimator returned shape {tuple(adv_b.shape)} for {len(rewards)} rewards"
        )
    components = components or [{} for _ in completions]
    group_id = uuid.uuid4().hex[:12]
    return [
        Episode(
            episode_id=f"{group_id}-{i}",
            prompt_ids=list(c.prompt_ids),
            response_ids=list(c.token_ids),
            behavior_logprobs=list(c.logprobs),
            reward=float(r),
            policy_version=c.generator_version,
            group_id=group_id,
            advantage=float(a),
            target=target,
            reward_breakdown=dict(comp),
            stop_reason=c.stop_reason,
        )
        for i, (c, r, a, comp) in enumerate(zip(completions, rewards, adv_b.tolist(), components))
    ]


async def greedy_completions(
    generate: Callable[..., Any], items: list[dict], max_tokens: int
) -> list[Any]:
    """One greedy completion per item (``prompt`` dicts), in order; ``generate`` is e.g.
    ``generator.generate.route``. All prompts are in flight at once so they batch."""

    async def one(item: dict) -> Any:
        (c,) = await generate(item["prompt"], n=1, temperature=0.0, max_tokens=max_tokens)
        return c

    return list(await asyncio.gather(*(one(it) for it in items)))


def accuracy_of(
    items: list[dict], completions: list[Any], reward_fn: Callable[[str, str, Any], float]
) -> float:
    """The mean of ``reward_fn`` over items and their completions (``greedy_completions``)."""
    scores = []
    for item, c in zip(items, completions):
        score = reward_fn(item["prompt"], c.text, item["target"])
        if not isinstance(score, (int, float)):
            raise TypeError(
                f"the evaluation reward returned {type(score).__name__} {score!r}; it must "
                "return a float (a vector reward cannot score held-out accuracy: set "
                "eval.reward to a scalar reward such as exact_match)"
            )
        scores.append(float(score))
    return sum(scores) / max(1, len(scores))


async def heldout_accuracy(
    generate: Callable[..., Any],
    items: list[dict],
    reward_fn: Callable[[str, str, Any], float],
    max_tokens: int,
) -> float:
    """Greedy accuracy on ``items`` (``prompt``/``target`` dicts); ``generate`` is e.g.
    ``generator.generate.route``."""
    return accuracy_of(items, await greedy_completions(generate, items, max_tokens), reward_fn)
