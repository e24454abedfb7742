"""Aggregation, KL estimators, TIS and policy losses on hand-computed numbers."""

import math

import pytest
import torch

from forge.losses import (
    LossConfig,
    aggregate,
    build_loss,
    grpo_loss,
    gspo_loss,
    kl_penalty,
    ppo_clip_loss,
    reinforce_loss,
    sequence_tis_weights,
    tis_weights,
)

LN2 = math.log(2.0)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _leaf(values) -> torch.Tensor:
    return _t(values).requires_grad_(True)


# ---------------------------------------------------------------- aggregation


LOSS_BT = _t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK_BT = _t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_aggregate_token_mean():
    assert aggregate(LOSS_BT, MASK_BT, "token_mean").item() == pytest.approx(10 / 4)


def test_aggregate_seq_mean():
    # row means 2 and 4 -> 3
    assert aggregate(LOSS_BT, MASK_BT, "seq_mean").item() == pytest.approx(3.0)


def test_aggregate_seq_mean_skips_empty_rows():
    loss_bt, mask_bt = _t([[1.0, 1.0], [5.0, 5.0]]), _t([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate(loss_bt, mask_bt, "seq_mean").item() == pytest.approx(1.0)


def test_aggregate_dr_grpo_uses_constant_divisor():
    assert aggregate(LOSS_BT, MASK_BT, "dr_grpo", max_tokens=5).item() == pytest.approx(1.0)
    assert aggregate(LOSS_BT, MASK_BT, "dr_grpo").item() == pytest.approx(10 / 6)


def test_aggregate_empty_mask_is_zero_not_nan():
    zeros = torch.zeros(2, 3)
    for mode in ("token_mean", "seq_mean", "dr_grpo"):
        assert aggregate(LOSS_BT, zeros, mode).item() == 0.0


def test_aggregate_errors():
    with pytest.raises(ValueError, match=r"unknown aggregation mode: 'mean'.*token_mean"):
        aggregate(LOSS_BT, MASK_BT, "mean")
    with pytest.raises(ValueError, match="must match"):
        aggregate(LOSS_BT, MASK_BT[:, :2], "token_mean")


# ---------------------------------------------------------------- KL


def test_kl_estimators_on_known_numbers():
    p, q = _t([[math.log(0.5)]]), _t([[math.log(0.25)]])  # p - q = ln 2
    assert kl_penalty(p, q, "k1").item() == pytest.approx(LN2)
    assert kl_penalty(p, q, "k2").item() == pytest.approx(0.5 * LN2**2)
    # d = q - p = -ln 2: exp(d) - d - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(p, q, "k3").item() == pytest.approx(LN2 - 0.5)
    for est in ("k1", "k2", "k3"):
        assert kl_penalty(p, p, est).item() == 0.0


def test_k1_and_k3_are_unbiased_estimates_of_kl():
    # Exact expectation over a 3-token vocabulary sampled from p: E_p[k] must equal KL(p||q).
    p, q = _t([0.5, 0.3, 0.2]), _t([0.2, 0.5, 0.3])
    kl = (p * (p / q).log()).sum().item()
    for est in ("k1", "k3"):
        k = kl_penalty(p.log().unsqueeze(0), q.log().unsqueeze(0), est)[0]
        assert (p * k).sum().item() == pytest.approx(kl, rel=1e-5)


def test_kl_gradient_flows_to_policy_only():
    p, q = _leaf([[math.log(0.5)]]), _leaf([[math.log(0.25)]])
    kl_penalty(p, q, "k3").sum().backward()
    # d k3 / dp = -exp(q - p) + 1 = 0.5
    assert p.grad.item() == pytest.approx(0.5)
    assert q.grad is None


def test_kl_unknown_estimator():
    with pytest.raises(ValueError, match=r"'k4' is not a built-in KL estimator.*k1, k2, k3"):
        kl_penalty(_t([[0.0]]), _t([[0.0]]), "k4")


# ---------------------------------------------------------------- clipped surrogate

RATIOS = [1.5, 0.5, 1.1]
ONES = _t([[1.0, 1.0, 1.0]])


def test_grpo_clipping_positive_advantage():
    lp = _leaf([[math.log(r) for r in RATIOS]])
    loss, m = grpo_loss(lp, torch.zeros(1, 3), _t([1.0]), ONES)
    # -min(r, clip(r, 0.8, 1.2)): 1.5 -> -1.2 (clipped), 0.5 -> -0.5, 1.1 -> -1.1
    assert loss.item() == pytest.approx(-(1.2 + 0.5 + 1.1) / 3)
    loss.backward()
    # d(-r)/d logp = -r, over 3 tokens; the clipped token gets no gradient
    torch.testing.assert_close(lp.grad, _t([[0.0, -0.5 / 3, -1.1 / 3]]))
    assert m["clip_fraction"] == pytest.approx(1 / 3)
    assert m["clip_high_fraction"] == pytest.approx(1 / 3)
    assert m["clip_low_fraction"] == 0.0
    assert m["ratio_mean"] == pytest.approx(sum(RATIOS) / 3)
    assert m["policy_loss"] == pytest.approx(loss.item())


def test_grpo_clipping_negative_advantage():
    lp = _leaf([[math.log(r) for r in RATIOS]])
    loss, m = grpo_loss(lp, torch.zeros(1, 3), _t([-1.0]), ONES)
    # -min(-r, -clip(r)): 1.5 -> 1.5, 0.5 -> 0.8 (clipped), 1.1 -> 1.1
    assert loss.item() == pytest.approx((1.5 + 0.8 + 1.1) / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([[1.5 / 3, 0.0, 1.1 / 3]]))
    assert m["clip_low_fraction"] == pytest.approx(1 / 3)
    assert m["clip_high_fraction"] == 0.0


def test_grpo_clip_higher_is_asymmetric():
    lp = _t([[math.log(1.25), math.log(0.75)]])
    adv_pos, adv_neg, mask = _t([1.0]), _t([-1.0]), _t([[1.0, 1.0]])
    gen = torch.zeros(1, 2)
    _, sym = grpo_loss(lp, gen, adv_pos, mask, clip_eps_low=0.2)
    _, dapo = grpo_loss(lp, gen, adv_pos, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    assert sym["clip_high_fraction"] == 0.5  # 1.25 > 1.2
    assert dapo["clip_high_fraction"] == 0.0  # 1.25 < 1.28
    _, neg = grpo_loss(lp, gen, adv_neg, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    assert neg["clip_low_fraction"] == 0.5  # 0.75 < 0.8


def test_grpo_on_policy_gradient_direction_and_mask():
    lp = _leaf([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    mask = _t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, m = grpo_loss(lp, lp.detach(), _t([2.0, -1.0]), mask)
    assert m["ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    # ratio 1: grad = -A / n_tokens (5) on counted tokens, 0 on the masked one
    torch.testing.assert_close(lp.grad, _t([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]]))


def test_grpo_uses_old_logprobs_when_given():
    lp = _t([[0.0]])
    _, m = grpo_loss(lp, _t([[-LN2]]), _t([1.0]), _t([[1.0]]), clip_eps_low=10.0)
    assert m["ratio_mean"] == pytest.approx(2.0)  # generator as old
    _, m = grpo_loss(lp, _t([[-LN2]]), _t([1.0]), _t([[1.0]]), old_logprobs_bt=_t([[0.0]]))
    assert m["ratio_mean"] == pytest.approx(1.0)


def test_grpo_takes_per_token_advantages_and_checks_their_shape():
    lp = _leaf([[0.0, 0.0]])
    loss, _ = grpo_loss(lp, torch.zeros(1, 2), _t([[2.0, -4.0]]), _t([[1.0, 1.0]]))
    loss.backward()  # credit over turns: each token its own advantage, -A / n_tokens
    torch.testing.assert_close(lp.grad, _t([[-1.0, 2.0]]))
    with pytest.raises(ValueError, match="advantages must have shape"):
        grpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 3), torch.ones(1, 2))


def test_ppo_per_token_advantages():
    lp = _leaf([[0.0, 0.0]])
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 2), _t([[2.0, -4.0]]), _t([[1.0, 1.0]]))
    assert loss.item() == pytest.approx((-2.0 + 4.0) / 2)
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([[-1.0, 2.0]]))
    with pytest.raises(ValueError, match="advantages must have shape"):
        ppo_clip_loss(lp, torch.zeros(1, 2), torch.ones(3), torch.ones(1, 2))


# ---------------------------------------------------------------- TIS


def test_tis_weights_are_capped_ratio_old_over_generator():
    old, gen = _t([[math.log(0.5), math.log(0.5), math.log(0.2)]]), _t([[-LN2 * 2, -LN2, 0.0]])
    torch.testing.assert_close(tis_weights(old, gen, cap=1.5), _t([[1.5, 1.0, 0.2]]))
    torch.testing.assert_close(tis_weights(old, gen, cap=5.0), _t([[2.0, 1.0, 0.2]]))
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        tis_weights(old, gen, cap=0.0)


def test_grpo_with_tis_scales_token_losses():
    old = _t([[math.log(0.5), math.log(0.5)]])
    gen = _t([[math.log(0.25), math.log(0.5)]])  # raw weights 2 and 1
    lp = old.clone().requires_grad_(True)  # ratio 1
    loss, m = grpo_loss(lp, gen, _t([1.0]), _t([[1.0, 1.0]]), old_logprobs_bt=old, tis_cap=1.5)
    assert loss.item() == pytest.approx(-(1.5 + 1.0) / 2)
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([[-0.75, -0.5]]))
    assert m["tis_capped_fraction"] == 0.5
    assert m["tis_weight_mean"] == pytest.approx(1.25)


def test_grpo_tis_without_old_logprobs_is_a_no_op():
    lp, gen, adv, mask = _t([[-0.3, -0.9]]), _t([[-0.5, -0.4]]), _t([1.0]), _t([[1.0, 1.0]])
    plain, _ = grpo_loss(lp, gen, adv, mask)
    with_tis, m = grpo_loss(lp, gen, adv, mask, tis_cap=2.0)
    assert with_tis.item() == pytest.approx(plain.item())
    assert m["tis_weight_mean"] == pytest.approx(1.0)


def test_sequence_tis_weights_use_geometric_mean():
    old, gen = _t([[0.0, 0.0, 5.0]]), _t([[-LN2, -LN2 * 3, 0.0]])
    mask = _t([[1.0, 1.0, 0.0]])
    # mean(old - gen) over counted tokens = 2 ln 2 -> 4, capped at 3
    torch.testing.assert_close(sequence_tis_weights(old, gen, mask, cap=10.0), _t([4.0]))
    torch.testing.assert_close(sequence_tis_weights(old, gen, mask, cap=3.0), _t([3.0]))


# ---------------------------------------------------------------- REINFORCE and GSPO


def test_reinforce():
    lp = _leaf([[-1.0, -2.0], [-1.0, -3.0]])
    mask = _t([[1.0, 1.0], [1.0, 0.0]])
    loss, m = reinforce_loss(lp, _t([2.0, -1.0]), mask)
    # -(A * logp): [2, 4] and [-1]; token mean = 5 / 3
    assert loss.item() == pytest.approx(5 / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))
    assert m["logprob_mean"] == pytest.approx(-4 / 3)
    seq, _ = reinforce_loss(lp, _t([2.0, -1.0]), mask, aggregation="seq_mean")
    assert seq.item() == pytest.approx((3.0 - 1.0) / 2)


def test_gspo_sequence_ratio_unclipped():
    lp = _leaf([[0.2, 0.0, 7.0]])
    mask = _t([[1.0, 1.0, 0.0]])
    loss, m = gspo_loss(lp, torch.zeros(1, 3), _t([1.0]), mask, clip_eps_low=0.2, clip_eps_high=0.2)
    s = math.exp(0.1)  # geometric mean of token ratios exp(0.2), exp(0)
    assert loss.item() == pytest.approx(-s)
    assert m["ratio_mean"] == pytest.approx(s)
    loss.backward()
    # d(-s)/d lp_t = -s / |y| on counted tokens
    torch.testing.assert_close(lp.grad, _t([[-s / 2, -s / 2, 0.0]]))


def test_gspo_default_clip_is_tight():
    lp = _leaf([[0.2, 0.0], [-0.5, -0.5]])
    loss, m = gspo_loss(lp, torch.zeros(2, 2), _t([1.0, -1.0]), torch.ones(2, 2))
    # seq 1: s = e^0.1 > 1.0004, A > 0 -> -1.0004; seq 2: s = e^-0.5 < 0.9997, A < 0 -> 0.9997
    assert loss.item() == pytest.approx((-1.0004 + 0.9997) / 2, abs=1e-6)
    assert m["clip_fraction"] == 1.0
    loss.backward()
    assert torch.all(lp.grad == 0)


def test_gspo_with_sequence_tis():
    lp = _t([[0.0, 0.0]])
    gen = _t([[-LN2, -LN2]])  # old = 0 -> sequence weight 2
    loss, m = gspo_loss(
        lp, gen, _t([1.0]), torch.ones(1, 2), old_logprobs_bt=torch.zeros(1, 2), tis_cap=5.0
    )
    assert loss.item() == pytest.approx(-2.0)
    assert m["tis_weight_mean"] == pytest.approx(2.0)


# ---------------------------------------------------------------- config and factory


def _batch(**extra):
    lp = _leaf([[-1.0, -2.0], [-0.5, -0.7]])
    batch = dict(
        logprobs_bt=lp,
        generator_logprobs_bt=lp.detach() - 0.1,
        advantages_b=_t([1.0, -1.0]),
        mask_bt=_t([[1.0, 1.0], [1.0, 0.0]]),
    )
    batch.update(extra)
    return batch


@pytest.mark.parametrize("loss_type", ["grpo", "ppo", "reinforce", "gspo"])
def test_build_loss_every_type_runs_and_backprops(loss_type):
    batch = _batch(ref_logprobs_bt=_t([[-1.1, -2.2], [-0.4, -0.7]]))
    loss, metrics = build_loss(LossConfig(type=loss_type, tis_cap=2.0, kl_coef=0.1))(**batch)
    loss.backward()
    assert batch["logprobs_bt"].grad.abs().sum() > 0
    assert metrics["loss"] == pytest.approx(loss.item())
    assert all(isinstance(v, float) for v in metrics.values())


def test_build_loss_adds_kl_term_with_coefficient():
    ref = _t([[-1.5, -2.0], [-0.5, -9.0]])
    batch = _batch(ref_logprobs_bt=ref)
    loss, m = build_loss(LossConfig(kl_coef=0.5, kl_estimator="k1"))(**batch)
    # k1 on counted tokens: 0.5, 0.0, 0.0 -> token mean 1/6
    assert m["kl_ref"] == pytest.approx(1 / 6)
    assert loss.item() == pytest.approx(m["policy_loss"] + 0.5 / 6)
    _, m0 = build_loss(LossConfig(kl_coef=0.0))(**_batch(ref_logprobs_bt=ref))
    assert m0["loss"] == pytest.approx(m0["policy_loss"])
    assert "kl_ref" in m0


def test_build_loss_kl_needs_reference():
    with pytest.raises(ValueError, match="needs ref_logprobs_bt"):
        build_loss(LossConfig(kl_coef=0.1))(**_batch())


def test_build_loss_resolves_type_defaults():
    cfg = LossConfig(type="gspo")
    assert cfg.resolved_clip() == (3e-4, 4e-4)
    assert cfg.resolved_aggregation() == "seq_mean"
    assert LossConfig(clip_eps_high=0.28).resolved_clip() == (0.2, 0.28)


def test_build_loss_unknown_type():
    cfg = LossConfig()
    cfg.type = "dpo"  # bypass __post_init__, as a config mutated after parsing would
    with pytest.raises(ValueError, match=r"unknown loss type: 'dpo'; choose one of .*grpo"):
        build_loss(cfg)
    with pytest.raises(ValueError, match="unknown loss type: 'dpo'"):
        LossConfig(type="dpo")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kl_estimator": "k9"}, "kl_estimator"),
        ({"aggregation": "mean"}, "aggregation"),
        ({"aggregation": "dr_grpo"}, "max_tokens"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"clip_eps_low": -0.1}, "clip_eps_low"),
    ],
)
def test_loss_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_build_loss_matches_direct_call():
    batch = _batch(old_logprobs_bt=_t([[-1.2, -1.8], [-0.5, -0.9]]))
    loss, _ = build_loss(LossConfig(clip_eps_high=0.28, tis_cap=1.1))(**batch)
    direct, _ = grpo_loss(
        batch["logprobs_bt"],
        batch["generator_logprobs_bt"],
        batch["advantages_b"],
        batch["mask_bt"],
        old_logprobs_bt=batch["old_logprobs_bt"],
        clip_eps_high=0.28,
        tis_cap=1.1,
    )
    assert loss.item() == pytest.approx(direct.item())
    per_token, _ = build_loss(LossConfig(type="ppo"))(**_batch(advantages_b=_t([[1.0, 2.0]] * 2)))
    assert torch.isfinite(per_token)


def test_entropy_bonus_gradient_is_minus_the_entropy_gradient_over_the_sampling():
    # One state, 3 moves with probabilities 1/2, 1/4, 1/4; four sampled tokens drawn in those
    # proportions (move 0 twice): over them, the bonus's gradient is exactly -dH/dlogits.
    logits = torch.tensor([math.log(2.0), 0.0, 0.0], requires_grad=True)
    logp = torch.log_softmax(logits, -1)
    moves = torch.tensor([0, 0, 1, 2])
    lp_bt = logp[moves].unsqueeze(-1)  # [4 rows, 1 token]
    mask = torch.ones_like(lp_bt)
    cfg = LossConfig(type="grpo", entropy_coef=0.5)
    loss, metrics = build_loss(cfg)(
        logprobs_bt=lp_bt,
        generator_logprobs_bt=lp_bt.detach(),
        advantages_b=torch.zeros(4),
        mask_bt=mask,
    )
    (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    p = logp.exp()
    entropy = -(p * logp).sum()
    (dh,) = torch.autograd.grad(entropy, logits, retain_graph=True)
    torch.testing.assert_close(grad, -0.5 * dh)
    assert abs(loss.item()) < 1e-7  # the term adds no value, only its gradient
    assert metrics["entropy_sampled"] == pytest.approx(float(-(logp[moves]).mean()))
    # off by default; a negative coefficient is refused
    loss0, _ = build_loss(LossConfig(type="grpo"))(
        logprobs_bt=lp_bt,
        generator_logprobs_bt=lp_bt.detach(),
        advantages_b=torch.zeros(4),
        mask_bt=mask,
    )
    assert torch.autograd.grad(loss0, logits, allow_unused=True)[0].abs().max() == 0
    with pytest.raises(ValueError, match="entropy_coef must be >= 0"):
        LossConfig(entropy_coef=-0.1)


def test_entropy_cap_bounds_the_push_a_rare_sampled_token_gets():
    # A token sampled at probability e^-6 (a tail token, no action): uncapped, its weight in
    # the bonus is 6 nats; with entropy_cap=3 it is 3, so the gradient on its logprob halves.
    logits = torch.tensor([6.0, 0.0], requires_grad=True)
    logp = torch.log_softmax(logits, -1)
    lp_bt = logp[1].reshape(1, 1)  # the rare token, sampled once
    batch = dict(
        generator_logprobs_bt=lp_bt.detach(), advantages_b=torch.zeros(1), mask_bt=torch.ones(1, 1)
    )

    def grad_on_rare(cap):
        cfg = LossConfig(type="grpo", entropy_coef=1.0, entropy_cap=cap)
        loss, _ = build_loss(cfg)(logprobs_bt=lp_bt, **batch)
        (g,) = torch.autograd.grad(loss, lp_bt, retain_graph=True)
        return float(g)

    assert float(lp_bt) < -6.0
    assert grad_on_rare(None) == pytest.approx(float(lp_bt))  # weight logp, uncapped
    assert grad_on_rare(3.0) == pytest.approx(-3.0)
    assert grad_on_rare(10.0) == pytest.approx(float(lp_bt))  # likelier than e^-10: exact
    with pytest.raises(ValueError, match="entropy_cap must be > 0"):
        LossConfig(entropy_cap=0.0)
