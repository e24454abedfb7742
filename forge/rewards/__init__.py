"""Reward functions: plain callables ``(prompt: str, response: str, target) -> float``.

Combine several with ``evaluate_rewards`` (``evaluate_rewards_batch`` for many responses),
which returns the total and each component by name. Everything here is thread-safe, so
reward actors can call it from worker threads; ``MathReward`` scores in child processes of
its own (``forge.rewards.bounded``), started on first use.
"""

from forge.rewards.aggregate import (
    RewardError,
    RewardFn,
    RewardResult,
    RewardTimeoutError,
    evaluate_rewards,
    evaluate_rewards_batch,
    reward_name,
)
from forge.rewards.exact_match import ExactMatch
from forge.rewards.format import LengthPenalty, ThinkingReward, length_penalty
from forge.rewards.math_reward import MathReward, extract_final_answer

__all__ = [
    "ExactMatch",
    "LengthPenalty",
    "MathReward",
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardTimeoutError",
    "ThinkingReward",
    "evaluate_rewards",
    "evaluate_rewards_batch",
    "extract_final_answer",
    "length_penalty",
    "reward_name",
]
