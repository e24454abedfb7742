"""Credit over turns: the estimators on hand-computed groups, turn-level GAE on a hand-built
3-turn row, per-token advantages through collation, and the run config's checks."""

from __future__ import annotations

import pytest
import torch

from forge.envs.messages import Trajectory
from forge.losses.turn_credit import (
    StateBaselineCredit,
    discounted_returns,
    episode_credit,
    gigpo_credit,
    turn_returns_credit,
)
from forge.losses.value import turn_gae_advantages
from forge.replay.collate import collate_episodes
from forge.rollout.groups import group_episodes
from forge.rollout.token_credit import assign_credit, sampled_turn_rewards
from forge.slots import CREDIT
from forge.types import Completion


def test_discounted_returns():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, -1.0, 2.0], 1.0) == [2.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], 1.5)


# Three episodes of one task. All start in "s0"; episodes 0 and 2 reach state "A", episode 1
# reaches "B". Only episode 0 wins (reward 1 on its last turn).
REWARDS = [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
STATES = [["s0", "A"], ["s0", "B"], ["s0", "A"]]
EPISODE_ADV = [1.0, -0.5, -0.5]


def test_episode_credit_repeats_the_episode_advantage():
    assert episode_credit(REWARDS, STATES, EPISODE_ADV) == [[1.0, 1.0], [-0.5, -0.5], [-0.5, -0.5]]


def test_gigpo_by_hand():
    out = gigpo_credit(REWARDS, STATES, EPISODE_ADV, gamma=1.0, scale=False)
    # Returns: ep0 [1, 1], ep1 [0, 0], ep2 [0, 0].
    # Step group s0: returns 1, 0, 0 (mean 1/3) -> +2/3, -1/3, -1/3.
    # Step group A: ep0 turn 1 (1) and ep2 turn 1 (0), mean 1/2 -> +1/2, -1/2. B: alone -> 0.
    expected = [[1 + 2 / 3, 1 + 0.5], [-0.5 - 1 / 3, -0.5], [-0.5 - 1 / 3, -0.5 - 0.5]]
    for row, want in zip(out, expected):
        assert row == pytest.approx(want)


def test_gigpo_scaled_and_weighted():
    out = gigpo_credit(REWARDS, STATES, [0.0, 0.0, 0.0], gamma=1.0, step_weight=2.0, eps=0.0)
    # s0: (r - 1/3) / std(1, 0, 0) with std = sqrt(2)/3; A: (r - 1/2) / (1/2).
    std = (2**0.5) / 3
    assert out[0][0] == pytest.approx(2 * (2 / 3) / std)
    assert out[1][0] == pytest.approx(2 * (-1 / 3) / std)
    assert out[0][1] == pytest.approx(2.0) and out[2][1] == pytest.approx(-2.0)
    assert out[1][1] == 0.0  # alone in state B


def test_gigpo_discounts_returns():
    # One state shared at different turn indices: returns 0.9 (one turn before the reward)
    # and 1.0 (the rewarded turn) with gamma 0.9 -> -0.05 and +0.05.
    out = gigpo_credit([[0.0, 1.0], [1.0]], [["x", "y"], ["y"]], [0.0, 0.0], gamma=0.9, scale=False)
    assert out == [[0.0, pytest.approx(0.0)], [pytest.approx(0.0)]]
    out = gigpo_credit([[0.0, 1.0], [1.0]], [["s", "y"], ["s"]], [0.0, 0.0], gamma=0.9, scale=False)
    assert out[0][0] == pytest.approx(-0.05) and out[1][0] == pytest.approx(0.05)


def test_turn_returns_normalise_over_the_group():
    out = turn_returns_credit([[1.0, 0.0], [0.0]], [["a", "b"], ["a"]], [0, 0], scale=False)
    # returns [1, 0] and [0]; mean 1/3
    assert out == [[pytest.approx(2 / 3), pytest.approx(-1 / 3)], [pytest.approx(-1 / 3)]]


def test_state_baseline_by_hand():
    fn = StateBaselineCredit(gamma=1.0, rate=0.25, normalize=False)
    # First group, no baseline yet: s0's turns against their group mean 1/3 (as GiGPO's step
    # level), A's against 1/2, B alone -> 0. Episode advantages are not used (weight 0).
    first = fn(REWARDS, STATES, EPISODE_ADV)
    expected = [[2 / 3, 0.5], [-1 / 3, 0.0], [-1 / 3, -0.5]]
    for row, want in zip(first, expected):
        assert row == pytest.approx(want)
    # The table after it: exact means over the first visits (1/n >= rate): s0 1/3, A 1/2, B 0.
    assert fn.values == pytest.approx({"s0": 1 / 3, "A": 0.5, "B": 0.0})
    # A second group is credited against the table, not against itself: one episode, in s0
    # then B, which wins. Its turns: 1 - 1/3 and 1 - 0.
    assert fn([[0.0, 1.0]], [["s0", "B"]], [0.0]) == [[pytest.approx(2 / 3), pytest.approx(1.0)]]
    # Then the table moves: s0 at its 4th visit by max(1/4, rate), B at its 2nd by 1/2.
    assert fn.values["s0"] == pytest.approx(1 / 3 + 0.25 * (1 - 1 / 3))
    assert fn.values["B"] == pytest.approx(0.5)


def test_state_baseline_normalizes_and_weighs_the_episode():
    fn = StateBaselineCredit(gamma=1.0, rate=1.0, episode_weight=2.0)
    # Residuals of a first group: s0 +-1/2 (mean square 1/4, scale 1/2) -> +-1, plus 2 x the
    # episode advantage.
    out = fn([[1.0], [0.0]], [["s0"], ["s0"]], [0.5, -0.5])
    assert out == [[pytest.approx(1.0 + 1.0)], [pytest.approx(-1.0 - 1.0)]]
    with pytest.raises(ValueError, match="rate"):
        StateBaselineCredit(rate=0.0)
    assert isinstance(CREDIT.resolve("state_baseline"), StateBaselineCredit)


def test_credit_slot_checks_shapes_and_names():
    fn = CREDIT.resolve({"fn": "gigpo", "kwargs": {"gamma": 0.5}}, key="rollout.credit")
    assert fn([[1.0]], [["s"]], [0.0]) == [[0.0]]
    with pytest.raises(ValueError, match="turn states"):
        fn([[1.0, 0.0]], [["s"]], [0.0])
    with pytest.raises(ValueError, match="credit"):
        CREDIT.validate("gipgo", key="rollout.credit")


def test_turn_gae_by_hand():
    # One row, three turns (runs of counted tokens) at [1, 3), [4, 5), [7, 9).
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1, 1]], dtype=torch.float32)
    values = torch.tensor([[9.0, 0.5, 7.0, 9.0, 0.2, 9.0, 9.0, -0.1, 3.0]])
    gamma, lam = 0.9, 0.8
    adv, ret = turn_gae_advantages([[0.0, 1.0, 2.0]], values, mask, gamma, lam)
    # V at each turn's first token: 0.5, 0.2, -0.1; V after the last turn: 0.
    a2 = 2.0 + gamma * 0.0 - (-0.1)
    a1 = 1.0 + gamma * (-0.1) - 0.2 + gamma * lam * a2
    a0 = 0.0 + gamma * 0.2 - 0.5 + gamma * lam * a1
    want_adv = [0, a0, a0, 0, a1, 0, 0, a2, a2]
    want_ret = [0, a0 + 0.5, a0 + 0.5, 0, a1 + 0.2, 0, 0, a2 - 0.1, a2 - 0.1]
    assert adv[0].tolist() == pytest.approx(want_adv)
    assert ret[0].tolist() == pytest.approx(want_ret)
    with pytest.raises(ValueError, match="3 turns"):
        turn_gae_advantages([[1.0]], values, mask)


def test_turn_gae_bootstraps_a_truncated_row():
    # Two turns at [1, 2) and [3, 4); the episode was cut after them, and position 5 holds
    # the critic's value of the state it was cut in (0.6).
    mask = torch.tensor([[0, 1, 0, 1, 0, 0]], dtype=torch.float32)
    values = torch.tensor([[0.0, 0.3, 0.0, 0.4, 0.0, 0.6]])
    gamma, lam = 0.5, 1.0
    adv, ret = turn_gae_advantages([[0.0, 1.0]], values, mask, gamma, lam, torch.tensor([5]))
    a1 = 1.0 + gamma * 0.6 - 0.4
    a0 = 0.0 + gamma * 0.4 - 0.3 + gamma * lam * a1
    assert adv[0].tolist() == pytest.approx([0, a0, 0, a1, 0, 0])
    assert ret[0, 3].item() == pytest.approx(a1 + 0.4)
    # -1: no bootstrap (the row ended)
    adv, _ = turn_gae_advantages([[0.0, 1.0]], values, mask, gamma, lam, torch.tensor([-1]))
    assert adv[0, 3].item() == pytest.approx(1.0 - 0.4)


def _traj(turn_rewards, states, spans, length, prompt=2) -> Trajectory:
    mask = [0] * length
    for s, e in spans:
        mask[s:e] = [1] * (e - s)
    return Trajectory(
        task_id="t",
        token_ids=list(range(length)),
        loss_mask=mask,
        logprobs=[0.0] * length,
        turn_versions=[0] * len(spans),
        turn_rewards=turn_rewards,
        reward=float(sum(r if not isinstance(r, dict) else sum(r.values()) for r in turn_rewards)),
        reward_components={},
        num_turns=len(spans),
        finish_reason="done",
        prompt_length=prompt,
        turn_spans=spans,
        turn_states=states,
    )


class _Log:
    def __init__(self):
        self.rows: dict[str, list[float]] = {}

    def add(self, key, values):
        self.rows.setdefault(key, []).extend(values)


def test_assign_credit_lays_turn_advantages_on_tokens_and_collates():
    from forge.rewards.vector import WeightedSum

    trajs = [
        _traj([0.0, 1.0], ["s0", "A"], [(2, 4), (6, 7)], 8),
        _traj([0.0, 0.0], ["s0", "B"], [(2, 3), (5, 6)], 6),
    ]
    comps = [
        Completion(
            "", t.token_ids[:2], t.token_ids[2:], [0.0] * (len(t.token_ids) - 2), "", "stop", 0
        )
        for t in trajs
    ]
    group = group_episodes(comps, [t.reward for t in trajs], None, lambda r, g: r - r.mean())
    for e, t in zip(group, trajs):
        e.loss_mask = t.loss_mask[2:]
    log = _Log()
    credit = CREDIT.resolve({"fn": "gigpo", "kwargs": {"gamma": 1.0, "scale": False}})
    assign_credit(group, trajs, credit, WeightedSum(), log)
    # Episode advantages +0.5 / -0.5; s0 returns 1, 0 -> +0.5 / -0.5; A and B alone.
    assert group[0].token_advantages == [1.0, 1.0, 0.0, 0.0, 0.5, 0.0]
    assert group[1].token_advantages == [-1.0, 0.0, 0.0, -0.5]
    assert log.rows["credit/step_grouped_turns"] == [0.5]
    assert log.rows["credit/advantage_std/turn0"] == [pytest.approx(1.0)]
    batch = collate_episodes(group)
    assert batch.advantages_b.shape == batch.input_ids_bt.shape
    assert batch.advantages_b[0, 2:].tolist() == group[0].token_advantages
    assert batch.advantages_b[1, :2].tolist() == [0.0, 0.0]


def test_turn_rewards_of_named_components_and_empty_turns():
    from forge.rewards.vector import WeightedSum

    t = _traj(
        [0.5, {"success": 1.0, "cost": -0.25}, 2.0], ["a", "b", "c"], [(2, 3), (4, 4), (5, 6)], 7
    )
    agg = WeightedSum(weights={"cost": 2.0})
    # turn 1 = 1.0 + 2 * -0.25 = 0.5; it sampled nothing, so its reward moves to turn 2.
    assert sampled_turn_rewards(t, agg) == [0.5, 2.5]


def _scored_group(turn_rewards, credit):
    """Two episodes through the run's scoring: GRPO episode advantages, then ``credit``."""
    from forge.losses import grpo_advantages
    from forge.rewards.vector import WeightedSum

    trajs = [_traj(r, ["s0", s], [(2, 4), (5, 7)], 8) for r, s in zip(turn_rewards, "AB")]
    comps = [
        Completion("", t.token_ids[:2], t.token_ids[2:], [0.0] * 6, "", "stop", 0) for t in trajs
    ]
    group = group_episodes(comps, [t.reward for t in trajs], None, grpo_advantages)
    for e, t in zip(group, trajs):
        e.loss_mask = t.loss_mask[2:]
    assign_credit(group, trajs, CREDIT.resolve(credit), WeightedSum(), _Log())
    return group


def test_nonzero_variance_keeps_equal_rewards_with_step_level_signal():
    """Both episodes score 1 in total, so their episode advantages are 0; with gamma 0.9 the
    shared state s0 returns 0.9 (reward late) and 1.0 (reward at once): GiGPO's step-level
    group gives s0's turns -0.05 / +0.05 (scale off), a signal the filter must keep."""
    from forge.rollout import nonzero_variance

    gigpo = {"fn": "gigpo", "kwargs": {"gamma": 0.9, "scale": False}}
    group = _scored_group([[0.0, 1.0], [1.0, 0.0]], gigpo)
    assert [e.advantage for e in group] == [0.0, 0.0]
    assert group[0].token_advantages == pytest.approx([-0.05, -0.05, 0.0, 0.0, 0.0, 0.0])
    assert group[1].token_advantages == pytest.approx([0.05, 0.05, 0.0, 0.0, 0.0, 0.0])
    assert nonzero_variance(group)
    # gamma 1: both returns from s0 are 1, every advantage is 0: nothing to learn, dropped.
    flat = _scored_group([[0.0, 1.0], [1.0, 0.0]], {**gigpo, "kwargs": {"gamma": 1.0}})
    assert all(a == 0 for e in flat for a in e.token_advantages)
    assert not nonzero_variance(flat)
    assert nonzero_variance(_scored_group([[0.0, 1.0], [0.0, 0.0]], "episode"))


def test_nonzero_variance_uses_the_advantages_relative_test():
    from forge.rollout import nonzero_variance
    from forge.types import Episode

    def group(*rewards):
        return [Episode(f"e{i}", [1], [2], [0.0], r, 0) for i, r in enumerate(rewards)]

    assert nonzero_variance(group(0.0, 2.0**-30))  # tiny rewards, all of it spread
    assert nonzero_variance(group(1.0, 1.0 + 2.0**-13))
    assert not nonzero_variance(group(1.0, 1.0 + 2.0**-23))  # one float32 ulp: rounding
    assert not nonzero_variance(group(0.0, 0.0, 0.0))


@pytest.mark.parametrize(
    ("config", "overrides", "error"),
    [
        ("apps/sumdigits/cpu.yaml", ["rl.rollout.credit=gigpo"], "no env section"),
        (
            "apps/guess/cpu.yaml",
            ["rl.rollout.credit=gigpo", "rl.trainer.loss.type=gspo"],
            "gspo takes one per sequence",
        ),
        (
            "apps/guess/cpu.yaml",
            ["rl.rollout.credit=gigpo", "rl.rollout.reward_aggregator=min"],
            "per-member",
        ),
        ("apps/guess/cpu.yaml", ["rl.rollout.credit=gipgo"], "rollout.credit"),
    ],
)
def test_run_config_checks_credit(config, overrides, error):
    from forge.launch import load_app
    from tests.helpers import REPO

    with pytest.raises(ValueError, match=error):
        load_app(REPO / config, overrides)


def test_run_config_takes_credit_with_kwargs():
    from forge.launch import load_app
    from tests.helpers import REPO

    _, cfg = load_app(
        REPO / "apps/guess/cpu.yaml",
        ["rl.rollout.credit.fn=gigpo", "rl.rollout.credit.kwargs.gamma=0.9"],
    )
    assert cfg.rl.rollout.credit.kwargs == {"gamma": 0.9}
    _, cfg = load_app(
        REPO / "apps/guess/cpu.yaml",
        ["rl.rollout.credit.fn=state_baseline", "rl.rollout.credit.kwargs.rate=0.1"],
    )
    fn = CREDIT.resolve(cfg.rl.rollout.credit)
    assert isinstance(fn, StateBaselineCredit) and fn.rate == 0.1
    with pytest.raises(ValueError, match="rate must be in"):
        load_app(
            REPO / "apps/guess/cpu.yaml",
            ["rl.rollout.credit.fn=state_baseline", "rl.rollout.credit.kwargs.rate=2"],
        )
