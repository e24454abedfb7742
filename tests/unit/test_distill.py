"""On-policy distillation maths (forge.losses.distill) on hand-computed numbers, properties
over random inputs, and the sign: a policy-gradient step on the distillation advantages
lowers the exact KL(student || teacher) of a toy categorical policy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.losses.distill import (
    discounted_future_sum,
    distill_advantages,
    distill_share,
    reverse_kl,
    teacher_kl,
)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_reverse_kl_is_student_minus_teacher_on_counted_tokens():
    s_bt = _t([[-1.0, -2.0, -0.5]])
    q_bt = _t([[-1.5, -1.0, float("-inf")]])  # a masked position may hold anything
    k_bt = reverse_kl(s_bt, q_bt, _t([[1.0, 1.0, 0.0]]))
    assert k_bt.tolist() == [[0.5, -1.0, 0.0]]


def test_advantage_without_discount_is_minus_coef_times_each_tokens_kl():
    s_bt, q_bt = _t([[-1.0, -2.0, -0.5]]), _t([[-1.5, -1.0, -0.5]])
    d_bt = distill_advantages(s_bt, q_bt, torch.ones(1, 3), coef=2.0, discount=0.0)
    # k = [0.5, -1.0, 0.0]: the teacher likes token 1 more than the student -> pushed up
    assert d_bt.tolist() == [[-1.0, 2.0, 0.0]]


def test_discount_is_a_reversed_discounted_cumulative_sum():
    x_bt = _t([[1.0, 2.0, 3.0]])
    # y2 = 3; y1 = 2 + 0.5 * 3 = 3.5; y0 = 1 + 0.5 * 3.5 = 2.75
    assert discounted_future_sum(x_bt, 0.5).tolist() == [[2.75, 3.5, 3.0]]
    assert discounted_future_sum(x_bt, 1.0).tolist() == [[6.0, 5.0, 3.0]]
    assert discounted_future_sum(x_bt, 0.0).tolist() == [[1.0, 2.0, 3.0]]
    # with k = x (teacher logprobs 0, student logprobs x) and coef 2: d = -2 y
    d_bt = distill_advantages(x_bt, torch.zeros(1, 3), torch.ones(1, 3), coef=2.0, discount=0.5)
    assert d_bt.tolist() == [[-5.5, -7.0, -6.0]]


def test_masked_positions_add_nothing_and_get_zero():
    s_bt = _t([[1.0, 100.0, 3.0, float("nan")]])
    mask_bt = _t([[1.0, 0.0, 1.0, 0.0]])  # an interior masked token, then padding
    d_bt = distill_advantages(s_bt, torch.zeros(1, 4), mask_bt, coef=1.0, discount=1.0)
    assert d_bt.tolist() == [[-4.0, 0.0, -3.0, 0.0]]


def test_discount_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\]"):
        discounted_future_sum(torch.zeros(1, 2), 1.5)


def test_teacher_kl_is_the_token_mean_over_counted_tokens():
    s_bt, q_bt = _t([[-1.0, -2.0], [-3.0, 0.0]]), _t([[-2.0, -2.0], [-1.0, 9.0]])
    mask_bt = _t([[1.0, 1.0], [1.0, 0.0]])
    assert teacher_kl(s_bt, q_bt, mask_bt) == pytest.approx((1.0 + 0.0 - 2.0) / 3)
    assert teacher_kl(s_bt, q_bt, torch.zeros(2, 2)) == 0.0


def test_distill_share_of_the_advantage():
    mask_bt = torch.ones(1, 2)
    assert distill_share(_t([[1.0, 1.0]]), _t([[1.0, -3.0]]), mask_bt) == pytest.approx(4 / 6)
    assert distill_share(torch.zeros(1, 2), _t([[1.0, -3.0]]), mask_bt) == 1.0
    assert distill_share(torch.zeros(1, 2), torch.zeros(1, 2), mask_bt) == 0.0


def test_shapes_must_match():
    with pytest.raises(ValueError, match="teacher_logprobs_bt has shape"):
        reverse_kl(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


floats = st.floats(min_value=-20.0, max_value=0.0, allow_nan=False, width=32)
rows = st.lists(floats, min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(rows, st.floats(0.0, 1.0), st.floats(0.0, 5.0))
def test_a_teacher_equal_to_the_student_gives_zero_advantage(lp, discount, coef):
    s_bt = _t([lp])
    d_bt = distill_advantages(s_bt, s_bt.clone(), torch.ones_like(s_bt), coef, discount)
    assert d_bt.abs().max().item() == 0.0


@settings(max_examples=60, deadline=None)
@given(rows, rows, st.floats(0.0, 1.0))
def test_discounted_sum_matches_its_definition(xs, mask_bits, discount):
    n = min(len(xs), len(mask_bits))
    x_bt, mask_bt = _t([xs[:n]]), _t([[float(b < -10.0) for b in mask_bits[:n]]])
    d_bt = distill_advantages(x_bt, torch.zeros_like(x_bt), mask_bt, 1.0, discount)
    for t in range(n):
        want = 0.0
        if mask_bt[0, t]:
            want = -sum(discount ** (u - t) * xs[u] for u in range(t, n) if mask_bt[0, u])
        assert d_bt[0, t].item() == pytest.approx(want, rel=1e-4, abs=1e-3)


def test_a_policy_gradient_step_on_the_advantages_lowers_the_reverse_kl():
    """The sign convention: REINFORCE with ``d_t`` as advantage descends KL(student||teacher)
    (a one-token categorical: exact KL before and after one step on 4096 samples)."""
    gen = torch.Generator().manual_seed(0)
    teacher_logp = torch.log_softmax(_t([2.0, 0.0, -1.0, 0.5]), -1)
    logits = torch.zeros(4, requires_grad=True)

    def kl() -> float:
        p = torch.softmax(logits.detach(), -1)
        return float((p * (p.log() - teacher_logp)).sum())

    before = kl()
    student_logp = torch.log_softmax(logits, -1)
    tokens = torch.multinomial(student_logp.exp().detach(), 4096, True, generator=gen)
    s_bt = student_logp[tokens].unsqueeze(-1)  # 4096 one-token responses
    d_bt = distill_advantages(s_bt, teacher_logp[tokens].unsqueeze(-1), torch.ones_like(s_bt))
    loss = -(d_bt * s_bt).mean()
    loss.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    assert kl() < before - 0.05, (before, kl())
    assert math.isfinite(kl())


def test_distill_share_checks_both_shapes_and_counts_any_magnitude():
    """Mutation pass: each argument's shape is checked, and a share is taken whenever the
    two terms are not both 0, however small they are (not only past a total of 1)."""
    mask = torch.ones(1, 2)
    assert distill_share(torch.zeros(1, 2), torch.tensor([[0.1, -0.1]]), mask) == 1.0
    share = distill_share(torch.tensor([[0.3, 0.0]]), torch.tensor([[0.0, -0.1]]), mask)
    assert share == pytest.approx(0.25)
    assert distill_share(torch.zeros(1, 2), torch.zeros(1, 2), mask) == 0.0
    with pytest.raises(ValueError, match="reward_advantages_bt has shape"):
        distill_share(torch.zeros(1, 3), torch.zeros(1, 2), mask)
    with pytest.raises(ValueError, match="distill_bt has shape"):
        distill_share(torch.zeros(1, 2), torch.zeros(2, 2), mask)
