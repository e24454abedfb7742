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
- ``state_baseline`` (``StateBaselineCredit``): a turn's return less the running mean return
  of its state over the whole run (every group and step), a tabular critic for
  environments whose states recur.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from forge.losses.advantages import dr_grpo_advantages, grpo_advantages

__all__ = [
    "StateBaselineCredit",
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
    Dr.GRPO's ``v - mean`` without ``scale``. Equal values (a step-level group of equal
    returns) give exactly 0."""
    v = torch.tensor(values, dtype=torch.float64)
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


class StateBaselineCredit:
    """A turn's return less the running mean return of its state, over the whole run.

    ``A[i][k] = episode_weight * episode_advantages[i] + (G[i][k] - V[s]) / scale``, where
    ``G`` is the discounted return (``gamma``) from turn ``k``, ``s`` its state key and
    ``V[s]`` the mean of the returns earlier turns got from that state: an exact mean over
    its first ``1 / rate`` visits, then an exponential average at ``rate`` (the policy moves).
    ``scale`` is a running root mean square of those residuals over all states (so
    advantages are about unit size, as GRPO's are), or 1 without ``normalize``.

    Where GiGPO's step-level groups hold only the turns of one group that meet a state, this
    baseline pools every group and step: a state visited once per group still gets a
    baseline, and a turn is credited with what followed it relative to what usually follows
    that state, without the noise of how the episode reached it. A state not met before
    falls back to the mean of its turns in this group (0 for a turn alone in it). Each
    group's returns update ``V`` after its advantages are computed, so no turn is its own
    baseline. The table lives in the process that scores episodes and starts empty (also
    after a resume). Suited to environments whose state keys recur (``info["state"]``);
    where they never repeat every turn falls back and this is ``episode_weight`` times GRPO.
    """

    def __init__(
        self,
        gamma: float = 1.0,
        rate: float = 0.05,
        episode_weight: float = 0.0,
        normalize: bool = True,
        eps: float = 1e-3,
    ) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"state_baseline gamma must be in [0, 1], got {gamma}")
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"state_baseline rate must be in (0, 1], got {rate}")
        if episode_weight < 0:
            raise ValueError(f"state_baseline episode_weight must be >= 0, got {episode_weight}")
        self.gamma, self.rate, self.episode_weight = gamma, rate, episode_weight
        self.normalize, self.eps = normalize, eps
        self.values: dict[Hashable, float] = {}
        self.visits: dict[Hashable, int] = defaultdict(int)
        self.residual_ms: float | None = None  # running mean square of G - V

    def __call__(
        self,
        turn_rewards: TurnValues,
        turn_states: list[list[Hashable]],
        episode_advantages: Sequence[float],
    ) -> TurnValues:
        _check(turn_rewards, turn_states, episode_advantages)
        returns = [discounted_returns(r, self.gamma) for r in turn_rewards]
        groups = step_groups(turn_states)
        residual = [[0.0] * len(r) for r in returns]
        for key, members in groups.items():
            if key in self.values:
                base = self.values[key]
            elif len(members) > 1:
                base = sum(returns[i][k] for i, k in members) / len(members)
            else:
                continue
            for i, k in members:
                residual[i][k] = returns[i][k] - base
        flat = [x for row in residual for x in row]
        if flat:
            ms = sum(x * x for x in flat) / len(flat)
            self.residual_ms = (
                ms
                if self.residual_ms is None
                else ((1 - self.rate) * self.residual_ms + self.rate * ms)
            )
        scale = max(self.residual_ms**0.5, self.eps) if self.normalize and flat else 1.0
        for key, members in groups.items():  # the baseline learns from this group last
            for i, k in members:
                self.visits[key] += 1
                step = max(1.0 / self.visits[key], self.rate)
                old = self.values.get(key, returns[i][k])
                self.values[key] = old + step * (returns[i][k] - old)
        return [
            [self.episode_weight * float(a) + x / scale for x in row]
            for row, a in zip(residual, episode_advantages)
        ]
