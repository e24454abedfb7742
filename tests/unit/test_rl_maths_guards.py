"""Issues 31 and 56: RL maths that cannot silently go wrong. One test (or more) per item, each
failing on the code before the fix; the invariants over every loss are in
test_loss_invariants.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from forge.config import config_from_dict
from forge.losses import (
    LossConfig,
    build_loss,
    dr_grpo_advantages,
    grpo_advantages,
    gspo_loss,
    kl_penalty,
    ppo_clip_loss,
    rloo_advantages,
)
from forge.losses.turn_credit import gigpo_credit, turn_returns_credit
from forge.training.trainer_config import TrainerConfig
from tests.helpers import REPO


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _rl(**over) -> dict:
    base = {"app": "x", "policy": {"model": "/m"}, "data": "jsonl", "rewards": ["exact_match"]}
    return {**base, **over}


# -- 1. the k3 KL on masked prompt positions ---------------------------------------------


def test_k3_kl_on_a_masked_prompt_logprob_of_minus_95_stays_finite():
    # Prompt position 0 is masked; the reference holds 0 there (collate), the trainer -95.
    lp = torch.tensor([[-95.0, -1.0, -2.0]], requires_grad=True)
    ref = _t([[0.0, -1.5, -1.0]])
    mask = _t([[0.0, 1.0, 1.0]])
    loss_fn = build_loss(LossConfig(type="grpo", kl_coef=0.1, kl_estimator="k3"))
    loss, m = loss_fn(
        logprobs_bt=lp,
        generator_logprobs_bt=lp.detach(),
        advantages_b=_t([1.0]),
        mask_bt=mask,
        ref_logprobs_bt=ref,
    )
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()
    assert lp.grad[0, 0] == 0  # no gradient reaches the masked position
    # The KL is the k3 of the two response tokens only, by hand: exp(d) - d - 1, d = q - p.
    d = torch.tensor([-0.5, 1.0])
    assert m["kl_ref"] == pytest.approx(float((d.exp() - d - 1).mean()), rel=1e-6)


def test_kl_log_ratio_is_clamped_to_20_on_response_positions():
    lp = torch.tensor([[-200.0]], requires_grad=True)
    kl = kl_penalty(lp, _t([[0.0]]), "k3", mask_bt=_t([[1.0]]))
    assert kl.item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-6)
    kl.sum().backward()
    assert lp.grad.item() == 0.0  # past the clamp: no gradient, not inf


# -- 2. the chunked LM head drops a model's logit post-scaling ----------------------------


def _tiny_granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    cfg = GraniteConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        logits_scaling=8.0,
    )
    return GraniteForCausalLM(cfg).eval()


def _forward_logprobs(model, ids_bt: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids_bt).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids_bt[:, 1:, None]).squeeze(-1)


def test_granite_logits_scaling_is_kept_by_token_logprobs():
    from forge.models import token_logprobs
    from forge.models.logprobs import check_split_head

    model = _tiny_granite()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids))
        want = _forward_logprobs(model, ids)
    assert check_split_head(model) is False  # the probe saw the chunked head disagree
    torch.testing.assert_close(lp[:, 1:], want, rtol=1e-5, atol=1e-5)


def test_split_head_is_checked_at_load_and_kept_for_plain_heads(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from forge.models import load_model
    from forge.models.logprobs import _split_head

    _tiny_granite().save_pretrained(tmp_path / "granite")
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    llama.save_pretrained(tmp_path / "llama")
    granite = load_model(tmp_path / "granite")
    assert granite._forge_split_head_ok is False and _split_head(granite) is None
    plain = load_model(tmp_path / "llama")
    assert plain._forge_split_head_ok is True and _split_head(plain) is not None


# -- 3. TIS with old_logprobs: generator ------------------------------------------------------


def test_tis_cap_with_generator_old_logprobs_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="old_logprobs: current"):
        TrainerConfig(model="/m", loss=LossConfig(tis_cap=2.0))
    TrainerConfig(model="/m", old_logprobs="current", loss=LossConfig(tis_cap=2.0))


def test_a_phase_that_turns_tis_on_under_generator_old_logprobs_is_refused():
    from forge import RLConfig

    data = _rl(phases=[{"at": 5, "loss": {"tis_cap": 2.0}}])
    with pytest.raises(ValueError, match=r"phases\[0\].loss.tis_cap"):
        config_from_dict(RLConfig, data)


def test_the_gpu_config_uses_trainer_old_logprobs_for_tis():
    from forge.launch import load_app

    _, cfg = load_app(REPO / "apps/grpo/configs/qwen3_1_7b.yaml", [])
    assert cfg.trainer.loss.tis_cap == 2.0 and cfg.trainer.old_logprobs == "current"


# -- 4. the overlong penalty under the minimum aggregator -------------------------------------


def test_overlong_penalty_is_added_after_aggregation_so_min_keeps_correctness():
    from forge.rewards.vector import minimum
    from forge.rollout.scoring import RolloutConfig, score_totals

    cfg = RolloutConfig(max_tokens=100, overlong_buffer=20, reward_aggregator="min")
    comps = [
        {"correct": 1.0, "format": 1.0},
        {"correct": 0.0, "format": 1.0},
        {"correct": 1.0, "format": 1.0},
    ]
    totals = score_totals(minimum(), comps, [10, 10, 90], cfg)
    assert totals == [1.0, 0.0, 0.5]  # right, wrong, right but 10 tokens into the buffer
    assert [c["overlong"] for c in comps] == [0.0, 0.0, -0.5]  # still logged


# -- 5. equal rewards -> exactly zero advantages ----------------------------------------------


@pytest.mark.parametrize("value,g", [(1.2, 8), (3.7, 7), (0.1, 16), (1e6 + 0.3, 5)])
def test_equal_rewards_give_exactly_zero_advantages(value, g):
    r = torch.full((g,), value)
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        assert torch.equal(fn(r, g), torch.zeros(g)), fn.__name__
    assert torch.equal(grpo_advantages(r, g, unbiased=True), torch.zeros(g))


@pytest.mark.parametrize("reward,gamma,n", [(1.0, 0.9, 5), (1.0, 0.95, 7), (0.3, 0.9, 3)])
def test_gigpo_step_groups_of_equal_discounted_returns_get_no_step_advantage(reward, gamma, n):
    # n episodes meet state "s" at turn 0 and are rewarded alike two turns later: their
    # returns from "s" are equal (before: +/-0.056 from a float32 mean one ulp off).
    rewards = [[0.0, 0.0, reward]] * n
    states = [["s", f"a{i}", f"b{i}"] for i in range(n)]
    out = gigpo_credit(rewards, states, [0.0] * n, gamma=gamma)
    assert out == [[0.0, 0.0, 0.0]] * n
    flat = turn_returns_credit([[0.9025]] * 3, [["x"]] * 3, [0.0] * 3)
    assert flat == [[0.0]] * 3


# -- 6. top-p / top-k under a trainer ---------------------------------------------------------


@pytest.mark.parametrize("sampling", [{"top_p": 0.9}, {"top_k": 50}])
def test_top_p_or_top_k_sampling_is_refused_for_rl(sampling):
    from forge import RLConfig

    with pytest.raises(ValueError, match="renormalised over the kept tokens"):
        config_from_dict(RLConfig, _rl(generator={"sampling": sampling}))


# -- 7. dual clip and the log-ratio clamp -----------------------------------------------------


def test_dual_clip_caps_a_negative_advantage_token_at_c():
    lp = torch.tensor([[math.log(4.5)]], requires_grad=True)
    old, adv, mask = _t([[0.0]]), _t([-2.0]), _t([[1.0]])
    plain, _ = ppo_clip_loss(lp, old, adv, mask)
    assert plain.item() == pytest.approx(9.0)  # 4.5 x 2: unbounded without the dual clip
    loss, m = ppo_clip_loss(lp, old, adv, mask, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(6.0)  # capped at c * |A|
    loss.backward()
    assert lp.grad.item() == 0.0 and m["clip_dual_fraction"] == 1.0
    # Positive advantages and ratios below c are untouched.
    lp2 = torch.tensor([[math.log(2.0)]], requires_grad=True)
    assert ppo_clip_loss(lp2, old, adv, mask, clip_ratio_c=3.0)[0].item() == pytest.approx(4.0)


def test_dual_clip_through_build_loss_and_its_config_checks():
    lp = torch.tensor([[math.log(4.5)]], requires_grad=True)
    kw = dict(generator_logprobs_bt=_t([[0.0]]), advantages_b=_t([-1.0]), mask_bt=_t([[1.0]]))
    loss, _ = build_loss(LossConfig(type="grpo", clip_ratio_c=3.0))(logprobs_bt=lp, **kw)
    assert loss.item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        LossConfig(clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="no clipped ratio"):
        LossConfig(type="reinforce", clip_ratio_c=3.0)


def test_log_ratio_is_clamped_before_exp():
    lp = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(lp, _t([[-100.0]]), _t([-1.0]), _t([[1.0]]))
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)  # exp(100) would be inf
    loss.backward()
    assert torch.isfinite(lp.grad).all()


# -- 8. group-relative advantages over groups of one ------------------------------------------


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo"])
def test_group_of_one_with_a_group_relative_advantage_is_refused(advantage):
    from forge import RLConfig

    data = _rl(rollout={"group_size": 1, "advantage": advantage})
    with pytest.raises(ValueError, match="group of one"):
        config_from_dict(RLConfig, data)
    # A critic gives the advantages instead (GAE): allowed.
    ppo = {**data, "critic": {"model": "/v"}, "trainer": {"loss": {"type": "ppo"}}}
    config_from_dict(RLConfig, ppo)


# -- 10. the KL estimators' gradients, stated exactly ------------------------------------------


def test_kl_estimator_gradients_in_expectation_over_the_policy():
    """Summing over a categorical support: E_pi[grad k] against the true KL gradients."""
    theta = torch.tensor([0.3, -1.0, 0.8, 0.1, -0.4], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.3, 1.0, 0.2], dtype=torch.float64), -1)

    def expected_grad(estimator: str) -> torch.Tensor:
        logp = torch.log_softmax(theta, -1)
        k = kl_penalty(logp.unsqueeze(0), ref.unsqueeze(0), estimator)[0]
        (g,) = torch.autograd.grad((logp.exp().detach() * k).sum(), theta)
        return g

    def true_grad(kl) -> torch.Tensor:
        logp = torch.log_softmax(theta, -1)
        (g,) = torch.autograd.grad(kl(logp), theta)
        return g

    reverse = true_grad(lambda lp: (lp.exp() * (lp - ref)).sum())  # KL(pi || ref)
    forward = true_grad(lambda lp: (ref.exp() * (ref - lp)).sum())  # KL(ref || pi)
    torch.testing.assert_close(expected_grad("k1"), torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(expected_grad("k2"), reverse)
    torch.testing.assert_close(expected_grad("k3"), forward)


def test_docs_state_the_kl_gradient_facts_and_the_absent_kl_in_reward():
    text = (Path(REPO) / "docs/rl_maths.md").read_text()
    for fact in ("zero expected gradient", "forward KL", "reverse KL", "use_kl_in_reward"):
        assert fact in text, fact


# -- 11. GSPO's band against generator noise ---------------------------------------------------


def test_gspo_logs_its_clipped_fraction_and_the_size_of_its_log_ratios():
    g = torch.Generator().manual_seed(0)
    b, t = 64, 300
    gen = -2.0 + torch.zeros(b, t)
    lp = gen + 0.01 * torch.randn(b, t, generator=g)  # trainer vs generator noise, step 0
    adv = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0)
    _, m = gspo_loss(lp, gen, adv, torch.ones(b, t))
    # |mean of 300 N(0, 0.01)| ~ 4.6e-4 on average: beyond the 3e-4 / 4e-4 band for many.
    assert m["log_ratio_abs_mean"] == pytest.approx(0.01 * math.sqrt(2 / math.pi / t), rel=0.3)
    assert 0.1 < m["clip_fraction"] < 0.5
    # With the trainer's own old logprobs (old_logprobs: current) the ratio is 1: no clipping.
    _, m = gspo_loss(lp, gen, adv, torch.ones(b, t), old_logprobs_bt=lp)
    assert m["clip_fraction"] == 0.0 and m["log_ratio_abs_mean"] == 0.0


# -- 12. GSPO with the generator's logprobs (issue 56) -----------------------------------------


def test_gspo_with_generator_old_logprobs_is_refused_naming_the_fix():
    from forge import RLConfig

    with pytest.raises(ValueError, match=r"type=gspo with trainer.old_logprobs=generator"):
        TrainerConfig(model="/m", old_logprobs="generator", loss=LossConfig(type="gspo"))
    with pytest.raises(ValueError, match=r"Set trainer.old_logprobs: current"):
        TrainerConfig(model="/m", old_logprobs="generator", loss=LossConfig(type="gspo"))
    TrainerConfig(model="/m", old_logprobs="current", loss=LossConfig(type="gspo", tis_cap=2.0))
    TrainerConfig(model="/m", old_logprobs="generator", loss=LossConfig(type="grpo"))
    phases = [{"at": 5, "loss": {"type": "gspo"}}]
    data = _rl(trainer={"old_logprobs": "generator"}, phases=phases)
    with pytest.raises(ValueError, match=r"phases\[0\].loss.type=gspo"):
        config_from_dict(RLConfig, data)
    config_from_dict(RLConfig, _rl(trainer={"old_logprobs": "current"}, phases=phases))


# -- 13. the k3 KL's value clamp (issue 56) ----------------------------------------------------


def test_kl_clamp_bounds_each_tokens_value_with_no_gradient_past_it():
    # r = q - p = 1 and 5 at p = 0: k3 = e - 2 and e^5 - 6 = 142.4, gradients 1 - e^r.
    ref, mask = _t([[1.0, 5.0]]), _t([[1.0, 1.0]])
    e = math.e
    for clamp, value, grad in (
        (None, [e - 2, e**5 - 6], [1 - e, 1 - e**5]),
        (10.0, [e - 2, 10.0], [1 - e, 0.0]),
    ):
        lp = torch.zeros(1, 2, requires_grad=True)
        kl = kl_penalty(lp, ref, "k3", mask, clamp=clamp)
        assert kl[0].tolist() == pytest.approx(value, rel=1e-6)
        kl.sum().backward()
        assert lp.grad[0].tolist() == pytest.approx(grad, rel=1e-6)
        # Through the loss: advantages 0, so only the KL moves lp (kl_coef 1, token_mean of 2).
        lp = torch.zeros(1, 2, requires_grad=True)
        loss, m = build_loss(LossConfig(kl_coef=1.0, kl_clamp=clamp))(
            logprobs_bt=lp,
            generator_logprobs_bt=lp.detach(),
            advantages_b=_t([0.0]),
            mask_bt=mask,
            ref_logprobs_bt=ref,
        )
        loss.backward()
        assert lp.grad[0].tolist() == pytest.approx([g / 2 for g in grad], rel=1e-6)
        assert m["kl_ref"] == pytest.approx(sum(value) / 2, rel=1e-6)
    # k1 = p - q can be negative: the clamp is two-sided.
    kl = kl_penalty(torch.zeros(1, 2), _t([[15.0, -15.0]]), "k1", clamp=10.0)
    assert kl[0].tolist() == [-10.0, 10.0]
    with pytest.raises(ValueError, match="kl_clamp must be > 0"):
        LossConfig(kl_clamp=0.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(r=st.floats(-30, 30, allow_nan=False))
@example(r=2.6108)  # just inside the clamp, where the gradient is largest
def test_kl_clamp_of_10_bounds_a_k3_tokens_gradient_by_12_6(r):
    lp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1, 1), r, dtype=torch.float64)
    kl_penalty(lp, ref, "k3", clamp=10.0).sum().backward()
    assert abs(lp.grad.item()) <= math.exp(2.6109) - 1  # k3 reaches 10 at r = 2.6109


# -- 14. bf16 weights under AdamW (issue 56) ---------------------------------------------------


def test_adamw_loses_a_1e_6_step_on_a_bf16_weight_near_0_02():
    """AdamW's first step moves a weight by lr (m / sqrt(v) = 1); a bf16 weight of 0.02 has an
    ulp of 2^-13 (its exponent is 2^-6, 7 mantissa bits), so a 1e-6 step rounds away."""
    w = torch.tensor(0.02, dtype=torch.bfloat16)
    assert float(torch.nextafter(w, torch.ones_like(w)) - w) == 2.0**-13
    for dtype, moves in ((torch.bfloat16, False), (torch.float32, True)):
        w = torch.nn.Parameter(torch.full((3,), 0.02, dtype=dtype))
        before = w.detach().clone()
        opt = torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0)
        w.grad = torch.ones_like(w)
        opt.step()
        assert (not torch.equal(w.detach(), before)) is moves, dtype


def test_bf16_weights_under_adamw_are_refused_unless_asked_for_by_name():
    from forge.training.trainer_config import LoraConfig, OptimizerConfig
    from forge.training.value_model import CriticConfig

    for dtype in ("bfloat16", "float16"):
        with pytest.raises(
            ValueError,
            match=rf"trainer.dtype={dtype} trains .*no float32 master copy.*trainer.dtype: "
            r"float32 with trainer.autocast: bfloat16.*trainer.optimizer.low_precision_weights",
        ):
            TrainerConfig(model="/m", device="cuda", dtype=dtype)
    opt_in = OptimizerConfig(low_precision_weights=True)
    TrainerConfig(model="/m", device="cuda", dtype="bfloat16", optimizer=opt_in)
    TrainerConfig(model="/m", device="cuda", dtype="float32", autocast="bfloat16")
    TrainerConfig(model="/m", device="cuda", dtype="bfloat16", lora=LoraConfig())  # fp32 adapters
    yaml = {"model": "/m", "device": "cuda", "dtype": "bfloat16"}
    with pytest.raises(ValueError, match="low_precision_weights"):
        config_from_dict(TrainerConfig, yaml)
    config_from_dict(TrainerConfig, {**yaml, "optimizer": {"low_precision_weights": True}})
    with pytest.raises(ValueError, match=r"Set critic.dtype: float32, or set critic.optimizer"):
        CriticConfig(model="/m", dtype="bfloat16")
    CriticConfig(model="/m", dtype="bfloat16", optimizer=opt_in)


def test_the_gpu_config_trains_float32_weights_under_bf16_autocast():
    from forge.launch import load_app

    _, cfg = load_app(REPO / "apps/grpo/configs/qwen3_1_7b.yaml", [])
    t = cfg.trainer
    assert t.dtype == "float32" and t.autocast == "bfloat16"
    assert not t.optimizer.low_precision_weights
    assert t.weights.dtype == cfg.generator.dtype == "bfloat16"  # pushes in the generator's type
