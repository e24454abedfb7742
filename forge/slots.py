"""Every extension point of Forge, in one table (see ``forge.plugins`` for the mechanism).

| slot | called as | built-ins |
|---|---|---|
| ``REWARD`` | ``fn(prompt, response, target) -> float | dict[str, float]`` | exact_match, math, thinking, length, reasoning_gym |
| ``REWARD_AGGREGATOR`` | ``fn(components_g: list[dict]) -> list[float]`` (one group) | weighted_sum, min, pareto |
| ``GROUP_FILTER`` | ``fn(group: list[Episode]) -> bool`` | nonzero_variance, keep_all |
| ``ADVANTAGE`` | ``fn(rewards_b: Tensor, group_size: int) -> Tensor`` | grpo, dr_grpo, rloo |
| ``CREDIT`` | ``fn(turn_rewards, turn_states, episode_advantages) -> per-turn advantages`` (one group) | episode, turn_returns, gigpo, state_baseline |
| ``LOSS`` | ``fn(*, logprobs_bt, generator_logprobs_bt, advantages_b, mask_bt, old_logprobs_bt, **_) -> (loss, metrics)`` | grpo, ppo, reinforce, gspo |
| ``KL`` | ``fn(logprobs_bt, ref_logprobs_bt) -> kl_bt`` | k1, k2, k3 |
| ``REFERENCE_UPDATE`` | ``fn(ref_sd, policy_sd, version) -> bool`` (edits ``ref_sd`` in place) | none, ema, reset (``ReferenceUpdateConfig.type``) |
| ``DATA_SOURCE`` | a factory; the object has ``sample()`` and ``heldout()`` | jsonl, hf, reasoning_gym, verifiers, seeds |
| ``ENVIRONMENT`` | a factory; the object has ``reset(task)`` and ``step(action)`` | verifiers, textarena, openenv |

A YAML value is a built-in name, an import string ``pkg.module:attr``, or
``{fn: <either>, kwargs: {...}}``; Python callers pass the callable itself.
"""

from __future__ import annotations

from forge.plugins import Slot

__all__ = [
    "ADVANTAGE",
    "CREDIT",
    "DATA_SOURCE",
    "ENVIRONMENT",
    "GROUP_FILTER",
    "KL",
    "LOSS",
    "REFERENCE_UPDATE",
    "REWARD",
    "REWARD_AGGREGATOR",
]

REWARD = Slot(
    "reward function",
    {
        "exact_match": "forge.rewards.exact_match:ExactMatch",
        "math": "forge.rewards.math_reward:MathReward",
        "thinking": "forge.rewards.format:ThinkingReward",
        "length": "forge.rewards.format:LengthPenalty",
        "reasoning_gym": "forge.integrations.reasoning_gym:ReasoningGymReward",
    },
    call=("prompt", "response", "target"),
)
REWARD_AGGREGATOR = Slot(
    "reward aggregator",
    {
        "weighted_sum": "forge.rewards.vector:WeightedSum",
        "min": "forge.rewards.vector:Minimum",
        "pareto": "forge.rewards.vector:ParetoRank",
    },
    call=("components_g",),
)
GROUP_FILTER = Slot(
    "group filter",
    {
        "nonzero_variance": "forge.rollout.filters:nonzero_variance",
        "keep_all": "forge.rollout.filters:keep_all",
    },
    call=("group",),
)
ADVANTAGE = Slot(
    "advantage estimator",
    {
        "grpo": "forge.losses.advantages:grpo_advantages",
        "dr_grpo": "forge.losses.advantages:dr_grpo_advantages",
        "rloo": "forge.losses.advantages:rloo_advantages",
    },
    call=("rewards_b", "group_size"),
)
CREDIT = Slot(
    "credit assignment over turns",
    {
        "episode": "forge.losses.turn_credit:episode_credit",
        "turn_returns": "forge.losses.turn_credit:turn_returns_credit",
        "gigpo": "forge.losses.turn_credit:gigpo_credit",
        "state_baseline": "forge.losses.turn_credit:StateBaselineCredit",
    },
    call=("turn_rewards", "turn_states", "episode_advantages"),
)
LOSS = Slot(
    "loss function",
    {},  # the built-in losses are chosen by LossConfig.type, see forge.losses.loss_config
    call=(
        "logprobs_bt=",
        "generator_logprobs_bt=",
        "advantages_b=",
        "mask_bt=",
        "old_logprobs_bt=",
    ),
)
KL = Slot(
    "KL estimator",
    {"k1": "forge.losses.kl:k1", "k2": "forge.losses.kl:k2", "k3": "forge.losses.kl:k3"},
    call=("logprobs_bt", "ref_logprobs_bt"),
)
REFERENCE_UPDATE = Slot(
    "reference update rule",
    {},  # the built-in rules are ReferenceUpdateConfig.type none/ema/reset
    call=("ref_sd", "policy_sd", "version"),
)
DATA_SOURCE = Slot(
    "data source",
    {
        "jsonl": "forge.data.sources:JsonlSource",
        "hf": "forge.data.sources:HFSource",
        "reasoning_gym": "forge.integrations.reasoning_gym:ReasoningGymSource",
        "verifiers": "forge.integrations.verifiers:VerifiersSource",
        "seeds": "forge.integrations.textarena:TextArenaSeeds",
    },
    factory=True,
    needs=("sample", "heldout"),
)
ENVIRONMENT = Slot(
    "environment",
    {
        "verifiers": "forge.integrations.verifiers:VerifiersEnv",
        "textarena": "forge.integrations.textarena:TextArenaEnv",
        "openenv": "forge.integrations.openenv:OpenEnvClient",
    },
    factory=True,
    needs=("reset", "step"),
)
