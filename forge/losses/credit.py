"""Credit over turns: one advantage per turn of each multi-turn episode in a group.

Episode-level GRPO gives every turn of an episode the same advantage, so a good move in a
lost game is pushed down with the bad ones; when the environment (or an opponent) is random,
the signal of any single move is buried. The estimators here give each turn its own
advantage, which the trainer broadcasts to that turn's sampled tokens.

Every estimator is called on one group (the ``G`` episodes of one task)::

    fn(turn_rewards, turn_states, episode_advantages) -> per-turn advantages

``turn_rewards[i][k]``: the scalar reward of episode ``i``'s turn ``k``; ``turn_states[i][k]``:
a hashable key of the state turn ``k`` was taken in (the environment's ``info["state"]``, by
default the observation text, see ``forge.envs.runner``); ``episode_advantages[i]``: the
episode's group-relative advantage (the run's ``rollout.advantage``). The result has the
shape of ``turn_rewards``. Built-ins (``rollout.credit``):

- ``episode``: every turn gets its episode's advantage (GRPO as it was; the default).
- ``turn_returns``: the discounted return from each turn, ``G_k = sum_j gamma^(j-k) r_j``,
  normalised over all the group's turns. With rewards only at the end and ``gamma = 1`` this
  is the episode's reward; with ``gamma < 1`` or per-turn rewards a turn is credited with
  what followed it.
- ``gigpo``: GiGPO's two levels (Feng et al., 2025, "Group-in-Group Policy Optimization").
  Turns of the group taken in the same state (equal keys, at any turn index) form a
  step-level group; a turn's advantage is its episode's advantage plus ``step_weight`` times
  its return relative to the other turns of its step-level group. A turn whose state no
  other turn of the group shares gets the episode's advantage alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from forge.losses.advantages import dr_grpo_advantages, grpo_advantages

__all__ = [
    "discounted_returns",
    "episode_credit",
    "gigpo_credit",
    "step_groups",
    "turn_returns_credit",
]

TurnValues = list[list[float]]


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """``G_k = r_k + gamma * G_{k+1}`` for one episode's turn rewards (``G`` after the last
    turn is 0)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out, g = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        g = float(rewards[k]) + gamma * g
        out[k] = g
    return out


def _check(turn_rewards, turn_states, episode_advantages) -> None:
    if not len(turn_rewards) == len(turn_states) == len(episode_advantages):
        raise ValueError(
            f"credit: {len(turn_rewards)} episodes of turn rewards, {len(turn_states)} of "
            f"turn states and {len(episode_advantages)} episode advantages; they must match"
        )
    for i, (r, s) in enumerate(zip(turn_rewards, turn_states)):
        if len(r) != len(s):
            raise ValueError(
                f"credit: episode {i} has {len(r)} turn rewards but {len(s)} turn states"
            )


def episode_credit(
    turn_rewards: TurnValues, turn_states: list[list[Hashable]], episode_advantages: Sequence[float]
) -> TurnValues:
    """Every turn gets its episode's advantage."""
    _check(turn_rewards, turn_states, episode_advantages)
    return [[float(a)] * len(r) for r, a in zip(turn_rewards, episode_advantages)]


def _normalised(values: list[float], scale: bool, eps: float) -> list[float]:
    """The values as one group: GRPO's ``(v - mean) / (std + eps)`` (population std), or
    Dr.GRPO's ``v - mean`` without ``scale``."""
    v = torch.tensor(values, dtype=torch.float32)
    out = grpo_advantages(v, len(values), eps) if scale else dr_grpo_advantages(v, len(values))
    return out.tolist()


def turn_returns_credit(
    turn_rewards: TurnValues,
    turn_states: list[list[Hashable]],
    episode_advantages: Sequence[float],
    *,
    gamma: float = 1.0,
    scale: bool = True,
    eps: float = 1e-6,
) -> TurnValues:
    """Each turn's discounted return, less the mean over all the group's turns (divided by
    their std when ``scale``). ``episode_advantages`` are not used."""
    _check(turn_rewards, turn_states, episode_advantages)
    returns = [discounted_returns(r, gamma) for r in turn_rewards]
    flat = [g for row in returns for g in row]
    if not flat:
        return [[] for _ in turn_rewards]
    norm = iter(_normalised(flat, scale, eps))
    return [[next(norm) for _ in row] for row in returns]


def step_groups(turn_states: list[list[Hashable]]) -> dict[Hashable, list[tuple[int, int]]]:
    """The group's turns by state key: ``{key: [(episode, turn), ...]}``."""
    groups: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, states in enumerate(turn_states):
        for k, key in enumerate(states):
            groups[key].append((i, k))
    return dict(groups)


def gigpo_credit(
    turn_rewards: TurnValues,
    turn_states: list[list[Hashable]],
    episode_advantages: Sequence[float],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale: bool = True,
    eps: float = 1e-6,
) -> TurnValues:
    """GiGPO: ``A[i][k] = episode_advantages[i] + step_weight * A_step[i][k]``.

    ``A_step`` is the turn's discounted return (``gamma``) relative to the returns of the
    other turns taken in the same state: less their mean, divided by their std when
    ``scale`` (a step-level group whose returns are all equal gives 0). A turn alone in its
    state has ``A_step = 0``.
    """
    _check(turn_rewards, turn_states, episode_advantages)
    if step_weight < 0:
        raise ValueError(f"gigpo step_weight must be >= 0, got {step_weight}")
    returns = [discounted_returns(r, gamma) for r in turn_rewards]
    out = [[float(a)] * len(r) for r, a in zip(turn_rewards, episode_advantages)]
    for members in step_groups(turn_states).values():
        if len(members) < 2:
            continue
        rel = _normalised([returns[i][k] for i, k in members], scale, eps)
        for (i, k), a in zip(members, rel):
            out[i][k] += step_weight * a
    return out
