"""Per-turn credit for a scored group of episodes: the ``rollout.credit`` estimator's turn
advantages, laid on each episode's sampled tokens.

    assign_credit(group, trajs, credit_fn, aggregate, log)

sets ``Episode.token_advantages`` (each turn's advantage on its sampled tokens) and logs the
share of turns in step-level groups and the advantage spread per turn index.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import pstdev

from forge.envs.messages import Trajectory
from forge.losses.turn_credit import step_groups
from forge.observability.names import M
from forge.rewards.vector import pad_components
from forge.types import Episode

__all__ = ["assign_credit", "sampled_turn_rewards", "turn_scalars"]

LOGGED_TURNS = 6  # advantage spread is logged for turn indices 0..5


def turn_scalars(traj: Trajectory, aggregate: Callable) -> list[float]:
    """One scalar reward per turn. Named (dict) rewards are combined with the run's reward
    aggregator applied to the episode's turns, which must then be per-member (a weighted
    sum): the turns' scalars then add up to the episode's reward."""
    rewards = traj.turn_rewards
    if all(not isinstance(r, dict) for r in rewards):
        return [float(r) for r in rewards]
    dicts = [r if isinstance(r, dict) else {"reward": float(r)} for r in rewards]
    return [float(x) for x in aggregate(pad_components(dicts))]


def sampled_turn_rewards(traj: Trajectory, aggregate: Callable) -> list[float]:
    """The scalar rewards of the turns that sampled tokens (``Episode.turn_rewards``); an
    empty turn's reward moves to the next turn that sampled (or the last one), so none is
    lost."""
    return _nonempty(turn_scalars(traj, aggregate), traj.turn_spans)


def _nonempty(rewards: list[float], spans: list[tuple[int, int]]) -> list[float]:
    out: list[float] = []
    carry = 0.0
    for r, (start, end) in zip(rewards, spans):
        carry += r
        if end > start:
            out.append(carry)
            carry = 0.0
    if out and carry:
        out[-1] += carry
    return out


def assign_credit(
    group: list[Episode], trajs: list[Trajectory], credit_fn: Callable, aggregate: Callable, log
) -> None:
    """Per-turn advantages for ``group`` (its episode advantages already set) from
    ``credit_fn`` (``forge.slots.CREDIT``); see the module docstring."""
    rewards = [turn_scalars(t, aggregate) for t in trajs]
    states = [list(t.turn_states) for t in trajs]
    advantages = credit_fn(rewards, states, [e.advantage for e in group])
    shapes = [len(r) for r in rewards]
    if [len(a) for a in advantages] != shapes:
        raise ValueError(
            f"rollout.credit returned {[len(a) for a in advantages]} advantages per episode "
            f"for episodes of {shapes} turns; it must return one per turn"
        )
    for e, t, adv in zip(group, trajs, advantages):
        p = t.prompt_length
        tokens = [0.0] * (len(t.token_ids) - p)
        for (start, end), a in zip(t.turn_spans, adv):
            tokens[start - p : end - p] = [float(a)] * (end - start)
        e.token_advantages = tokens
    grouped = sum(len(m) for m in step_groups(states).values() if len(m) > 1)
    log.add(M.STEP_GROUPED_TURNS, [grouped / max(1, sum(shapes))])
    for k in range(min(LOGGED_TURNS, max(shapes, default=0))):
        at_k = [float(a[k]) for a in advantages if len(a) > k]
        log.add(M.advantage_std(k), [pstdev(at_k) if len(at_k) > 1 else 0.0])
