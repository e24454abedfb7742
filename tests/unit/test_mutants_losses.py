"""Boundaries of the losses' own argument checks and of their one-token and at-the-cap cases
(the mutation pass, docs/rl_maths.md): each check refuses the first bad value and accepts the
first good one, so moving a bound by one step or flipping a comparison fails here."""

from __future__ import annotations

import math

import pytest
import torch

from forge.losses import (
    aggregate,
    grpo_loss,
    gspo_loss,
    kl_penalty,
    reinforce_loss,
    tis_weights,
)
from forge.losses.tis import sequence_tis_weights, tis_metrics


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_kl_clamp_refuses_zero_and_negative_and_takes_any_positive_bound():
    lp, ref = _t([[-1.0, -3.0]]), _t([[-2.0, -1.0]])
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="KL clamp must be > 0"):
            kl_penalty(lp, ref, "k1", clamp=bad)
    # k1 = p - q = [1, -2]; a clamp of 0.5 bounds both, None leaves them
    torch.testing.assert_close(kl_penalty(lp, ref, "k1", clamp=0.5), _t([[0.5, -0.5]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), _t([[1.0, -2.0]]))


def test_tis_cap_refuses_zero_and_takes_a_cap_below_one():
    old, gen = _t([[0.0, math.log(2.0)]]), _t([[0.0, 0.0]])
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        tis_weights(old, gen, 0.0)
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        sequence_tis_weights(old, gen, torch.ones(1, 2), 0.0)
    torch.testing.assert_close(tis_weights(old, gen, 0.5), _t([[0.5, 0.5]]))
    torch.testing.assert_close(tis_weights(old, gen, 1.5), _t([[1.0, 1.5]]))


def test_a_ratio_exactly_at_the_tis_cap_is_not_counted_as_capped():
    old, gen = _t([[math.log(2.0), math.log(4.0)]]), _t([[0.0, 0.0]])
    m = tis_metrics(old, gen, torch.ones(1, 2), 2.0)
    assert m["tis_capped_fraction"] == 0.5  # 4 > 2 is capped, 2 == 2 is not
    assert m["tis_weight_mean"] == pytest.approx(2.0)


def test_clip_eps_of_zero_is_accepted_and_clips_every_move_away_from_one():
    lp = _t([[math.log(1.5), math.log(0.5)]]).requires_grad_(True)
    gen = torch.zeros(1, 2)
    loss, m = grpo_loss(lp, gen, _t([1.0]), torch.ones(1, 2), clip_eps_low=0.0)
    # r = [1.5, 0.5], clip to [1, 1]: -min(r, 1) per token = [-1, -0.5]
    assert loss.item() == pytest.approx(-0.75)
    assert m["clip_high_fraction"] == 0.5 and m["clip_low_fraction"] == 0.0
    with pytest.raises(ValueError, match="clip eps must be >= 0"):
        grpo_loss(lp, gen, _t([1.0]), torch.ones(1, 2), clip_eps_low=-1e-3)
    with pytest.raises(ValueError, match="clip eps must be >= 0"):
        grpo_loss(lp, gen, _t([1.0]), torch.ones(1, 2), clip_eps_high=-1e-3)


def test_dual_clip_refuses_one_and_takes_anything_above():
    lp, gen, mask = torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        grpo_loss(lp, gen, _t([-1.0]), mask, clip_ratio_c=1.0)
    # ratio 4, A = -1: the plain surrogate is 4, capped at c * |A| = 1.5
    lp4 = _t([[math.log(4.0)]])
    loss, m = grpo_loss(lp4, gen, _t([-1.0]), mask, clip_ratio_c=1.5)
    assert loss.item() == pytest.approx(1.5) and m["clip_dual_fraction"] == 1.0


def test_dr_grpo_refuses_zero_max_tokens_and_divides_by_one():
    loss_bt, mask = _t([[2.0, 4.0]]), torch.ones(1, 2)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        aggregate(loss_bt, mask, "dr_grpo", max_tokens=0)
    assert aggregate(loss_bt, mask, "dr_grpo", max_tokens=1).item() == 6.0


def test_gspo_ratio_of_a_one_token_sequence_is_that_tokens_ratio():
    lp = _t([[math.log(1.25), 0.0], [math.log(1.5), math.log(1.5)]])
    mask = _t([[1.0, 0.0], [1.0, 1.0]])
    gen = torch.zeros(2, 2)
    _, m = gspo_loss(lp, gen, _t([1.0, 1.0]), mask, clip_eps_low=1.0, clip_eps_high=1.0)
    assert m["ratio_mean"] == pytest.approx((1.25 + 1.5) / 2)
    assert m["log_ratio_abs_mean"] == pytest.approx((math.log(1.25) + math.log(1.5)) / 2)


def test_gspo_sequence_tis_mean_leaves_out_empty_rows():
    old = _t([[math.log(2.0), 0.0], [5.0, 5.0]])
    gen = torch.zeros(2, 2)
    mask = _t([[1.0, 0.0], [0.0, 0.0]])  # the second row counts no token
    _, m = gspo_loss(torch.zeros(2, 2), gen, _t([1.0, 1.0]), mask, old_logprobs_bt=old, tis_cap=3.0)
    assert m["tis_weight_mean"] == pytest.approx(2.0)
    _, none = gspo_loss(
        torch.zeros(1, 2), torch.zeros(1, 2), _t([1.0]), torch.zeros(1, 2), tis_cap=3.0
    )
    assert none["tis_weight_mean"] == 1.0  # no counted row: the neutral weight


def test_reinforce_refuses_logprobs_that_would_broadcast_over_the_mask():
    with pytest.raises(ValueError, match="logprobs_bt has shape"):
        reinforce_loss(torch.zeros(1, 2), _t([1.0, 1.0]), torch.ones(2, 2))


def test_reinforce_tis_weighs_each_token_by_old_over_generator_and_checks_both_shapes():
    lp = _t([[-1.0, -2.0]]).requires_grad_(True)
    gen, old, mask = torch.zeros(1, 2), _t([[math.log(2.0), 0.0]]), torch.ones(1, 2)
    loss, m = reinforce_loss(
        lp, _t([1.0]), mask, old_logprobs_bt=old, generator_logprobs_bt=gen, tis_cap=5.0
    )
    # -(A * lp) weighted by [2, 1]: (2 * 1 + 1 * 2) / 2 tokens
    assert loss.item() == pytest.approx(2.0) and m["policy_loss"] == pytest.approx(2.0)
    assert m["tis_weight_mean"] == pytest.approx(1.5)
    for bad in (
        {"old_logprobs_bt": torch.zeros(1, 1)},
        {"generator_logprobs_bt": torch.zeros(1, 1)},
    ):
        kwargs = {"old_logprobs_bt": old, "generator_logprobs_bt": gen, **bad}
        with pytest.raises(ValueError, match=f"{next(iter(bad))} has shape"):
            reinforce_loss(lp, _t([1.0]), mask, tis_cap=5.0, **kwargs)
