"""Invariants every loss, advantage and credit estimator keeps, on generated inputs (issue 31).

- finite loss and gradients whatever the masked positions hold (0, -95, +/-1e4, +/-inf, NaN);
- the mask fully respected: changing a masked value changes nothing;
- invariance to the amount of padding and to the order of groups;
- micro-batched gradients (each part weighted by its share of the denominator, as the trainer
  does) equal the full batch's;
- the on-policy ratio is exactly 1 at step 0;
- equal rewards give exactly zero advantages, per episode group and per step group.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from forge.losses import (
    LossConfig,
    build_loss,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_group_fraction,
)
from forge.losses.turn_credit import gigpo_credit, turn_returns_credit
from forge.losses.value import clipped_value_loss, whiten
from forge.training.trainer_core import loss_denominator

CONFIGS = {
    "grpo_k3_token_mean": LossConfig(type="grpo", kl_coef=0.1),
    "grpo_k2_seq_mean_dual": LossConfig(
        type="grpo", kl_coef=0.1, kl_estimator="k2", aggregation="seq_mean", clip_ratio_c=3.0
    ),
    "ppo_k1_tis": LossConfig(type="ppo", kl_coef=0.05, kl_estimator="k1", tis_cap=2.0),
    "reinforce_dr_grpo_entropy": LossConfig(
        type="reinforce", aggregation="dr_grpo", max_tokens=16, tis_cap=2.0, entropy_coef=0.01
    ),
    "gspo_tis_kl": LossConfig(type="gspo", tis_cap=2.0, kl_coef=0.1),
}
GARBAGE = [0.0, -95.0, -1e4, 1e4, math.inf, -math.inf, math.nan]
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)  # reproducible in CI

seeds = st.integers(0, 2**31 - 1)
shapes = st.tuples(st.integers(1, 6), st.integers(2, 12))


def _batch(seed: int, b: int, t: int) -> dict[str, torch.Tensor]:
    """Counted logprobs in [-12, 0], the generator's and the reference near them, advantages
    of both signs, a random mask (rows may have no counted token)."""
    g = torch.Generator().manual_seed(seed)
    lp = -12 * torch.rand(b, t, generator=g)
    return {
        "logprobs_bt": lp,
        "generator_logprobs_bt": lp + 0.3 * torch.randn(b, t, generator=g),
        "ref_logprobs_bt": lp + 0.5 * torch.randn(b, t, generator=g),
        "advantages_b": torch.randn(b, generator=g),
        "mask_bt": (torch.rand(b, t, generator=g) < 0.7).float(),
    }


def _fill_masked(batch: dict, value: float) -> dict:
    m = batch["mask_bt"] == 0
    out = dict(batch)
    for key in ("logprobs_bt", "generator_logprobs_bt", "ref_logprobs_bt"):
        out[key] = torch.where(m, torch.full_like(batch[key], value), batch[key])
    return out


def _run(cfg: LossConfig, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    lp = batch["logprobs_bt"].clone().requires_grad_(True)
    loss, _ = build_loss(cfg)(**{**batch, "logprobs_bt": lp})
    loss.backward()
    return loss.detach(), lp.grad


@pytest.mark.parametrize("name", CONFIGS)
@SETTINGS
@given(seed=seeds, shape=shapes, garbage=st.sampled_from(GARBAGE))
def test_masked_values_change_nothing_and_never_make_nan(name, seed, shape, garbage):
    batch = _batch(seed, *shape)
    clean_loss, clean_grad = _run(CONFIGS[name], _fill_masked(batch, 0.0))
    loss, grad = _run(CONFIGS[name], _fill_masked(batch, garbage))
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[batch["mask_bt"] == 0] == 0).all()
    torch.testing.assert_close(loss, clean_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, clean_grad, rtol=0, atol=0)


@pytest.mark.parametrize("name", CONFIGS)
@SETTINGS
@given(seed=seeds, shape=shapes, pad=st.integers(1, 4), garbage=st.sampled_from(GARBAGE))
def test_padding_amount_does_not_change_loss_or_gradient(name, seed, shape, pad, garbage):
    batch = _batch(seed, *shape)
    padded = {
        k: (torch.nn.functional.pad(v, (0, pad), value=0.0) if v.dim() == 2 else v)
        for k, v in batch.items()
    }
    loss, grad = _run(CONFIGS[name], batch)
    loss_p, grad_p = _run(CONFIGS[name], _fill_masked(padded, garbage))
    torch.testing.assert_close(loss_p, loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad_p[:, : shape[1]], grad, rtol=1e-6, atol=1e-9)
    assert (grad_p[:, shape[1] :] == 0).all()


@pytest.mark.parametrize("name", CONFIGS)
@SETTINGS
@given(seed=seeds, groups=st.integers(2, 4), size=st.integers(1, 3), t=st.integers(2, 8))
def test_group_order_does_not_change_loss_and_permutes_gradients(name, seed, groups, size, t):
    batch = _batch(seed, groups * size, t)
    order = torch.randperm(groups, generator=torch.Generator().manual_seed(seed))
    rows = (order.unsqueeze(1) * size + torch.arange(size)).reshape(-1)
    permuted = {k: v[rows] for k, v in batch.items()}
    loss, grad = _run(CONFIGS[name], batch)
    loss_p, grad_p = _run(CONFIGS[name], permuted)
    torch.testing.assert_close(loss_p, loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_p, grad[rows], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", CONFIGS)
@SETTINGS
@given(seed=seeds, shape=st.tuples(st.integers(2, 6), st.integers(2, 10)), data=st.data())
def test_micro_batched_gradient_equals_the_full_batch_gradient(name, seed, shape, data):
    cfg = CONFIGS[name]
    batch = _batch(seed, *shape)
    cut = data.draw(st.integers(1, shape[0] - 1))
    agg = cfg.resolved_aggregation()
    _, full_grad = _run(cfg, batch)
    total = max(loss_denominator(batch["mask_bt"], agg), 1.0)
    micro_grad = torch.zeros_like(full_grad)
    for rows in (slice(0, cut), slice(cut, None)):
        part = {k: v[rows] for k, v in batch.items()}
        lp = part["logprobs_bt"].clone().requires_grad_(True)
        loss, _ = build_loss(cfg)(**{**part, "logprobs_bt": lp})
        (loss * (loss_denominator(part["mask_bt"], agg) / total)).backward()
        micro_grad[rows] = lp.grad
    torch.testing.assert_close(micro_grad, full_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", [n for n in CONFIGS if not n.startswith("reinforce")])
@SETTINGS
@given(seed=seeds, shape=shapes)
def test_on_policy_ratio_is_exactly_one_at_step_0(name, seed, shape):
    """The shipped default, no ``old_logprobs_bt`` (``trainer.old_logprobs: generator``): the
    ratio's denominator is the generator's logprobs, which at step 0 on-policy are the
    policy's own."""
    batch = _batch(seed, *shape)
    batch["generator_logprobs_bt"] = batch["logprobs_bt"].clone()
    lp = batch["logprobs_bt"].clone().requires_grad_(True)
    _, metrics = build_loss(CONFIGS[name])(**{**batch, "logprobs_bt": lp})
    assert metrics["clip_fraction"] == 0.0
    if batch["mask_bt"].sum() > 0:  # (means over no counted token are 0)
        assert metrics["ratio_mean"] == 1.0
        assert metrics.get("tis_weight_mean", 1.0) == 1.0


def test_on_policy_grpo_gradient_is_the_policy_gradient_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -9.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, _ = build_loss(LossConfig(type="grpo"))(
        logprobs_bt=lp, generator_logprobs_bt=lp.detach(), advantages_b=adv, mask_bt=mask
    )
    loss.backward()  # d/dlp of -A * exp(lp - old) at lp = old is -A, token_mean over 3 tokens
    torch.testing.assert_close(lp.grad, torch.tensor([[0, -2 / 3, -2 / 3], [0, 1 / 3, 0]]))


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@SETTINGS
@given(value=finite, size=st.integers(2, 16), groups=st.integers(1, 4), seed=seeds)
@example(value=1.2, size=8, groups=1, seed=0)  # float32 mean one ulp off: +/-0.107 before
@example(value=3.7, size=7, groups=2, seed=0)
def test_equal_rewards_give_exactly_zero_advantage_in_their_group(value, size, groups, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(groups, size, generator=g) * 3
    rewards[0] = value  # group 0 all equal
    flat = rewards.reshape(-1)
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        adv = fn(flat, size).reshape(groups, size)
        assert torch.equal(adv[0], torch.zeros(size)), fn.__name__
        assert torch.isfinite(adv).all()
    assert torch.equal(grpo_advantages(torch.full((groups,), value), 1), torch.zeros(groups))


@SETTINGS
@given(value=finite, size=st.integers(2, 16), seed=seeds)
def test_group_advantages_are_independent_of_group_order(value, size, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.randn(3, size, generator=g) + value).reshape(-1)
    order = torch.tensor([2, 0, 1])
    rows = (order.unsqueeze(1) * size + torch.arange(size)).reshape(-1)
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        assert torch.equal(fn(rewards[rows], size), fn(rewards, size)[rows]), fn.__name__


# Rewards whose differences are far from the equal-rewards tolerance on either side: equal,
# 2^-13 of their size apart, or further.
REWARD_VALUES = [0.0, 1.0, 1.0 + 2.0**-13, -1.0, 3.5, 3.5 * (1.0 + 2.0**-12), 1e-3]


@SETTINGS
@given(
    groups=st.lists(
        st.lists(st.sampled_from(REWARD_VALUES), min_size=4, max_size=4), min_size=1, max_size=5
    ),
    scale=st.sampled_from([1e-6, 1e6, 2.0**-30, 2.0**30]),
)
@example(groups=[[1.0, 1.0 + 2.0**-13, 1.0, 1.0]], scale=1e-6)
def test_scaling_every_reward_keeps_which_groups_are_equal(groups, scale):
    """Multiplying all rewards by any scale changes no group's "all equal" verdict: the zeroed
    groups are the same (GRPO's nonzero z-scores move only by ``eps``), and Dr.GRPO's and
    RLOO's advantages scale with the rewards."""
    r = torch.tensor(groups, dtype=torch.float64).reshape(-1)
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        zero, zero_scaled = fn(r, 4) == 0, fn(r * scale, 4) == 0
        assert torch.equal(zero, zero_scaled), (fn.__name__, groups, scale)
    for fn in (dr_grpo_advantages, rloo_advantages):
        torch.testing.assert_close(fn(r * scale, 4), fn(r, 4) * scale, rtol=1e-6, atol=0)
    fraction = zero_variance_group_fraction(r, 4)
    assert zero_variance_group_fraction(r * scale, 4) == fraction


@SETTINGS
@given(
    reward=st.floats(-10, 10, allow_nan=False),
    gamma=st.floats(0.5, 1.0),
    turns=st.integers(1, 4),
    episodes=st.integers(2, 6),
    ep_adv=st.lists(st.floats(-2, 2, allow_nan=False), min_size=6, max_size=6),
)
def test_equal_returns_in_a_step_group_add_exactly_nothing(reward, gamma, turns, episodes, ep_adv):
    """Every episode passes the shared state "s" at turn 0 and gets the same final reward: the
    step-level group's returns are equal, so GiGPO gives each turn its episode advantage."""
    rewards = [[0.0] * (turns - 1) + [reward]] * episodes
    states = [["s"] + [f"{i}-{k}" for k in range(1, turns)] for i in range(episodes)]
    adv = ep_adv[:episodes]
    for scale in (True, False):
        out = gigpo_credit(rewards, states, adv, gamma=gamma, scale=scale)
        assert out == [[a] * turns for a in adv]
    flat = turn_returns_credit([[reward]] * episodes, [["x"]] * episodes, adv)
    assert flat == [[0.0]] * episodes


@SETTINGS
@given(seed=seeds, shape=shapes, garbage=st.sampled_from(GARBAGE))
def test_value_loss_and_whitening_respect_the_mask(seed, shape, garbage):
    g = torch.Generator().manual_seed(seed)
    b, t = shape
    mask = (torch.rand(b, t, generator=g) < 0.7).float()
    values, old, returns = (torch.randn(b, t, generator=g) for _ in range(3))

    def run(fill: float):
        def f(x):
            return torch.where(mask == 0, torch.full_like(x, fill), x)

        v = f(values).requires_grad_(True)
        loss, _ = clipped_value_loss(v, f(old), f(returns), mask, 0.2)
        loss.backward()
        return loss.detach(), v.grad, whiten(f(returns), mask)

    clean, dirty = run(0.0), run(garbage)
    for a, c in zip(dirty, clean):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, c, rtol=0, atol=0)
