"""Group advantages on hand-computed rewards."""

import math

import pytest
import torch

from forge.losses import (
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_group_fraction,
)


def _close(actual: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=tol, rtol=0)


def test_grpo_population_std_one_group():
    # mean 0.5, population std 0.5 -> z-scores +-1 (up to eps).
    _close(grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4), [1.0, -1.0, -1.0, 1.0])


def test_grpo_sample_std_scales_by_sqrt_g_minus_1_over_g():
    # sample std = sqrt((4 * 0.25) / 3) = 1 / sqrt(3); 0.5 * sqrt(3) = 0.8660
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, unbiased=True)
    h = 0.5 * math.sqrt(3)
    _close(adv, [h, -h, -h, h])


def test_grpo_groups_are_consecutive_and_constant_groups_get_zero():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0, 2.0, 4.0]), 2)
    _close(adv, [1.0, -1.0, 0.0, 0.0, -1.0, 1.0])
    assert torch.isfinite(adv).all()


def test_grpo_eps_in_denominator():
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), 2, eps=0.5)
    _close(adv, [0.5, -0.5])  # 0.5 / (0.5 + 0.5)


def test_dr_grpo_is_mean_centred_only():
    _close(dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4), [0.5, -0.5, -0.5, 0.5])
    _close(dr_grpo_advantages(torch.tensor([2.0, 4.0, 9.0]), 3), [-3.0, -1.0, 4.0])


def test_rloo_leave_one_out():
    # r=1: others mean (0+0+1)/3 = 1/3 -> 2/3; r=0: others (1+0+1)/3 = 2/3 -> -2/3
    t = 2.0 / 3.0
    _close(rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4), [t, -t, -t, t])
    _close(rloo_advantages(torch.tensor([3.0, 1.0, 5.0, 5.0]), 2), [2.0, -2.0, 0.0, 0.0])


def test_rloo_equals_scaled_dr_grpo():
    r = torch.tensor([0.3, 1.7, -2.0, 0.9, 4.0, 1.0])
    torch.testing.assert_close(rloo_advantages(r, 3), dr_grpo_advantages(r, 3) * 3 / 2)


def test_zero_variance_group_fraction():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])
    assert zero_variance_group_fraction(r, 2) == pytest.approx(2 / 3)
    assert zero_variance_group_fraction(r, 6) == 0.0
    assert zero_variance_group_fraction(torch.ones(4), 2) == 1.0


def test_integer_rewards_are_accepted():
    _close(dr_grpo_advantages(torch.tensor([1, 0]), 2), [0.5, -0.5])


@pytest.mark.parametrize(
    "fn", [grpo_advantages, dr_grpo_advantages, rloo_advantages, zero_variance_group_fraction]
)
def test_bad_shapes_raise(fn):
    with pytest.raises(ValueError, match="whole number of groups"):
        fn(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        fn(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="group_size"):
        fn(torch.zeros(4), 0)


def test_group_size_one_limits():
    _close(grpo_advantages(torch.tensor([3.0, 5.0]), 1), [0.0, 0.0])
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.tensor([3.0, 5.0]), 1)
    with pytest.raises(ValueError, match="unbiased"):
        grpo_advantages(torch.tensor([3.0, 5.0]), 1, unbiased=True)


# -- "all equal" is relative to the rewards' scale ---------------------------------------------


def test_rewards_apart_by_a_ten_thousandth_of_their_size_are_a_signal():
    # 1 + 2^-13 is exact in float32: spread 1.22e-4 of the rewards' size, far above rounding.
    d = 2.0**-13
    r = torch.tensor([1.0, 1.0 + d])
    _close(dr_grpo_advantages(r, 2), [-d / 2, d / 2], tol=0)
    _close(rloo_advantages(r, 2), [-d, d], tol=0)
    z = (d / 2) / (d / 2 + 1e-6)  # population std d/2, eps 1e-6
    _close(grpo_advantages(r, 2), [-z, z], tol=1e-7)
    assert zero_variance_group_fraction(r, 2) == 0.0


def test_rewards_a_billionth_apart_at_that_scale_are_a_signal():
    d = 2.0**-30  # 9.3e-10: the whole group is this small, the spread is all of it
    r = torch.tensor([0.0, d, 0.0, d])
    _close(dr_grpo_advantages(r, 4), [-d / 2, d / 2, -d / 2, d / 2], tol=0)
    assert zero_variance_group_fraction(r, 4) == 0.0
    assert zero_variance_group_fraction(r * 0, 4) == 1.0  # all zero: equal


def test_rewards_one_float32_ulp_apart_are_equal():
    r = torch.tensor([1.0, 1.0 + 2.0**-23, 1e6, 1e6 + 0.0625])  # one ulp each
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        assert torch.equal(fn(r, 2), torch.zeros(4)), fn.__name__
    assert zero_variance_group_fraction(r, 2) == 1.0
