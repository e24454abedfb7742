"""Reward functions: plain callables ``(prompt: str, response: str, target) -> float``.

Combine several with ``evaluate_rewards``, which returns the total and each component by
name. Everything here is thread-safe and free of process state, so reward actors can call
it from worker threads.
"""

from forge.rewards.aggregate import (
    RewardError,
    RewardFn,
    RewardResult,
    evaluate_rewards,
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
    "ThinkingReward",
    "evaluate_rewards",
    "extract_final_answer",
    "length_penalty",
    "reward_name",
]
