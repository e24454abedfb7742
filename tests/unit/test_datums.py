"""Token-datum training (the Tinker API's losses): each loss against its formula computed
independently, gradient accumulation over calls, the Adam step's parameters, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge.training import OptimizerConfig, TrainerConfig, TrainerCore
from forge.training import datums as ops


def _core(model: str) -> TrainerCore:
    return TrainerCore(TrainerConfig(model=model, optimizer=OptimizerConfig(lr=1e-3)))


def _datum(tokens, **inputs):
    return {"tokens": list(tokens), "inputs": {k: np.asarray(v) for k, v in inputs.items()}}


def _reference_logprobs(core, tokens, targets) -> torch.Tensor:
    with torch.no_grad():
        logits = core.model(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(tokens)), torch.tensor(targets)]


def test_cross_entropy_is_the_weighted_sum_and_outputs_target_logprobs(tiny_model):
    core = _core(tiny_model)
    a, b = [5, 9, 13, 21], [7, 8, 30]
    ta, tb = [9, 13, 21, 2], [8, 30, 2]
    wa, wb = [0, 1, 1, 0.5], [1, 1, 0]
    out, metrics = ops.forward_backward(
        core,
        [_datum(a, target_tokens=ta, weights=wa), _datum(b, target_tokens=tb, weights=wb)],
        "cross_entropy",
        None,
        forward_only=True,
    )
    la, lb = _reference_logprobs(core, a, ta), _reference_logprobs(core, b, tb)
    np.testing.assert_allclose(out[0]["logprobs"], la.numpy(), atol=1e-5)
    np.testing.assert_allclose(out[1]["logprobs"], lb.numpy(), atol=1e-5)  # padding ignored
    expected = -(la * torch.tensor(wa)).sum() - (lb * torch.tensor(wb)).sum()
    assert metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["tokens:sum"] == 7
    assert all(p.grad is None for p in core.model.parameters())  # forward only


def test_gradients_add_up_over_calls_until_the_optimizer_step(tiny_model):
    core = _core(tiny_model)
    d = _datum([5, 9, 13], target_tokens=[9, 13, 2], weights=[1, 1, 1])
    ops.forward_backward(core, [d], "cross_entropy", None, forward_only=False)
    p = next(p for p in core.model.parameters() if p.grad is not None)
    once = p.grad.clone()
    ops.forward_backward(core, [d], "cross_entropy", None, forward_only=False)
    torch.testing.assert_close(p.grad, 2 * once)
    before = p.detach().clone()
    adam = dict(
        learning_rate=0.01, beta1=0.5, beta2=0.9, eps=1e-8, weight_decay=0.0, grad_clip_norm=0.0
    )
    metrics = ops.optim_step(core, adam)
    assert metrics["grad_norm"] > 0 and metrics["step"] == 1
    assert p.grad is None
    group = core.optimizer.param_groups[0]
    assert group["lr"] == 0.01 and group["betas"] == (0.5, 0.9)
    # Adam's first step moves each weight by about lr (sign of the gradient).
    moved = (p.detach() - before)[once.abs() > 1e-5].abs()
    assert moved.median().item() == pytest.approx(0.01, rel=1e-2)


def test_importance_sampling_gradient_is_the_advantage_weighted_ratio(tiny_model):
    core = _core(tiny_model)
    tokens, targets = [5, 9, 13, 21], [9, 13, 21, 2]
    lp = _reference_logprobs(core, tokens, targets)
    sampled = (lp - 0.3).numpy()  # the sampler's logprobs: ratio exp(0.3) everywhere
    adv = np.array([0.0, 1.0, -2.0, 0.5], dtype=np.float32)
    _, metrics = ops.forward_backward(
        core,
        [_datum(tokens, target_tokens=targets, logprobs=sampled, advantages=adv)],
        "importance_sampling",
        None,
        forward_only=True,
    )
    assert metrics["loss:sum"] == pytest.approx(-np.exp(0.3) * adv.sum(), rel=1e-4)


def test_ppo_clips_the_ratio_where_the_advantage_is_positive(tiny_model):
    core = _core(tiny_model)
    tokens, targets = [5, 9, 13], [9, 13, 21]
    lp = _reference_logprobs(core, tokens, targets)
    sampled = (lp - 1.0).numpy()  # ratio e ~ 2.72, above any clip
    adv = np.array([1.0, 1.0, -1.0], dtype=np.float32)
    cfg = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    _, metrics = ops.forward_backward(
        core,
        [_datum(tokens, target_tokens=targets, logprobs=sampled, advantages=adv)],
        "ppo",
        cfg,
        forward_only=True,
    )
    # min(r A, clip(r) A): 1.1 for each positive advantage, -e for the negative one.
    assert metrics["loss:sum"] == pytest.approx(-(1.1 + 1.1 - np.e), rel=1e-4)


def test_bad_requests_are_named_before_any_compute(tiny_model):
    core = _core(tiny_model)
    d = _datum([5, 9], target_tokens=[9, 2])
    with pytest.raises(ops.DatumError, match="'cispo' is not supported"):
        ops.forward_backward(core, [d], "cispo", None, forward_only=False)
    with pytest.raises(ops.DatumError, match="needs loss_fn_inputs\\['logprobs'\\]"):
        ops.forward_backward(core, [d], "importance_sampling", None, forward_only=False)
    with pytest.raises(ops.DatumError, match="same length"):
        ops.forward_backward(
            core,
            [_datum([5, 9, 1], target_tokens=[9, 2])],
            "cross_entropy",
            None,
            forward_only=False,
        )
    with pytest.raises(ops.DatumError, match="not used by 'cross_entropy'"):
        ops.forward_backward(core, [d], "cross_entropy", {"clip_low_threshold": 0.5}, False)
    with pytest.raises(ops.DatumError, match="unknown Adam parameters"):
        ops.optim_step(core, {"learning_rate": 1e-3, "momentum": 0.9})


def test_temperature_in_loss_fn_config_scores_at_the_sampling_temperature(tiny_model):
    """Tinker scores forward_backward at T = 1 (the default here too); samples drawn at T
    report logprobs of logits / T, so ``temperature: T`` makes the on-policy ratio exactly 1."""
    core = _core(tiny_model)
    tokens, targets = [5, 9, 13, 21], [9, 13, 21, 2]
    with torch.no_grad():
        logits = core.model(input_ids=torch.tensor([tokens])).logits[0].float()
    at_t = torch.log_softmax(logits / 0.5, -1)[torch.arange(4), torch.tensor(targets)]
    adv = np.array([1.0, -1.0, 0.5, 2.0], dtype=np.float32)
    d = _datum(tokens, target_tokens=targets, logprobs=at_t.numpy(), advantages=adv)
    for loss_fn in ("importance_sampling", "ppo"):
        out, metrics = ops.forward_backward(
            core, [d], loss_fn, {"temperature": 0.5}, forward_only=True
        )
        np.testing.assert_allclose(out[0]["logprobs"], at_t.numpy(), rtol=1e-5, atol=1e-5)
        assert metrics["loss:sum"] == pytest.approx(-adv.sum(), rel=1e-4)  # ratio 1
    # Without it: Tinker's T = 1, the ratio of T=1 logprobs to the T=0.5 ones is not 1.
    _, metrics = ops.forward_backward(core, [d], "importance_sampling", None, True)
    assert metrics["loss:sum"] != pytest.approx(-adv.sum(), rel=1e-2)
    with pytest.raises(ops.DatumError, match="temperature must be a number > 0"):
        ops.forward_backward(core, [d], "ppo", {"temperature": 0.0}, True)
    with pytest.raises(ops.DatumError, match="not used by 'cross_entropy'"):
        ops.forward_backward(core, [d], "cross_entropy", {"temperature": 0.5}, True)


def test_soft_targets_are_k_weighted_tokens_per_position_with_the_hand_computed_gradient(
    tiny_model,
):
    """``cross_entropy`` with ``[N, K]`` ``target_tokens`` and ``weights`` (the cookbook's
    sdft sends a teacher's top-K this way): the loss is ``-sum w[i, k] logp(t[i, k])``, the
    output is the ``[N, K]`` logprobs, and the gradient on the logits at position ``i`` is
    ``sum_k w[i, k] * softmax(z_i) - sum_k w[i, k] * onehot(t[i, k])``."""
    core = _core(tiny_model)
    tokens = [5, 9, 13, 21]
    t_nk = np.array([[9, 4, 7], [13, 2, 9], [21, 22, 23], [2, 2, 5]])
    w_nk = np.array([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.25, 0.25, 0.5]])
    captured = {}

    def keep_logits(module, args, out):
        out.retain_grad()
        captured["z"] = out

    hook = core.model.lm_head.register_forward_hook(keep_logits)
    try:
        out, metrics = ops.forward_backward(
            core, [_datum(tokens, target_tokens=t_nk, weights=w_nk)], "cross_entropy", None, False
        )
    finally:
        hook.remove()
    z = captured["z"][0].detach().float()
    logp = torch.log_softmax(z, -1)
    ref_nk = logp.gather(-1, torch.tensor(t_nk))
    assert out[0]["logprobs"].shape == (4, 3)
    np.testing.assert_allclose(out[0]["logprobs"], ref_nk.numpy(), atol=1e-5)
    assert metrics["loss:sum"] == pytest.approx(float(-(torch.tensor(w_nk) * ref_nk).sum()), 1e-5)
    expected = torch.tensor(w_nk.sum(1), dtype=torch.float32)[:, None] * logp.exp()
    expected.scatter_add_(1, torch.tensor(t_nk), -torch.tensor(w_nk, dtype=torch.float32))
    torch.testing.assert_close(captured["z"].grad[0].float(), expected, atol=1e-6, rtol=1e-4)

    # K one-hot columns of weight 1 are K ordinary cross_entropy datums: the same gradient.
    core.optimizer.zero_grad(set_to_none=True)
    ops.forward_backward(
        core,
        [_datum(tokens, target_tokens=t_nk[:, :2], weights=np.ones((4, 2)))],
        "cross_entropy",
        None,
        False,
    )
    p = next(p for p in core.model.parameters() if p.grad is not None)
    soft = p.grad.clone()
    core.optimizer.zero_grad(set_to_none=True)
    for k in range(2):
        d = _datum(tokens, target_tokens=t_nk[:, k], weights=np.ones(4))
        ops.forward_backward(core, [d], "cross_entropy", None, False)
    torch.testing.assert_close(p.grad, soft, atol=1e-6, rtol=1e-5)


def test_soft_targets_that_do_not_fit_are_named(tiny_model):
    core = _core(tiny_model)
    tokens, t_nk = [5, 9, 13], np.array([[9, 4], [13, 2], [21, 22]])
    bad = {
        "same shape": _datum(tokens, target_tokens=t_nk, weights=np.ones(3)),
        r"shape \[2, 2\] for a model_input of 3 tokens": _datum(
            tokens, target_tokens=t_nk[:2], weights=np.ones((2, 2))
        ),
    }
    for match, d in bad.items():
        with pytest.raises(ops.DatumError, match=match):
            ops.forward_backward(core, [d], "cross_entropy", None, True)
    mixed = [_datum(tokens, target_tokens=t_nk), _datum(tokens, target_tokens=t_nk[:, 0])]
    with pytest.raises(ops.DatumError, match=r"got K = \[0, 2\]"):
        ops.forward_backward(core, mixed, "cross_entropy", None, True)
    d = _datum(tokens, target_tokens=t_nk, logprobs=np.zeros(3), advantages=np.ones((3, 2)))
    with pytest.raises(ops.DatumError, match="only cross_entropy's target_tokens and weights"):
        ops.forward_backward(core, [d], "importance_sampling", None, True)
