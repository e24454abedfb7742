"""The LM head's float32 product through oneDNN (forge/models/cpu_head.py): the same values
and gradients as ``F.linear`` up to float32 rounding, and only on the heads it is meant for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from forge.models import cpu_head
from forge.models.cpu_head import onednn_linear, use_onednn_head

pytestmark = pytest.mark.skipif(
    not cpu_head.usable(torch.nn.Linear(64, 1 << 14, bias=False)), reason="no oneDNN in torch"
)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= 1e-4 * (float(b.abs().max()) + 1.0))


def test_values_and_gradients_equal_linear():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3000, 48, generator=gen).requires_grad_()
    x = torch.randn(2, 5, 48, generator=gen).requires_grad_()
    g = torch.randn(2, 5, 3000, generator=gen)
    got = onednn_linear(x, w)
    assert got.shape == (2, 5, 3000)
    (got * g).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    want = F.linear(x, w)
    (want * g).sum().backward()
    assert _close(got, want) and _close(gx, x.grad) and _close(gw, w.grad)
    # A strided input (a slice of a wider batch) gives the same rows.
    wide = torch.randn(4, 5, 48, generator=gen)
    assert _close(onednn_linear(wide[:, 1:4], w), F.linear(wide[:, 1:4], w))


def test_a_bias_is_added_with_and_without_autograd():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(300, 48, generator=gen).requires_grad_()
    b = torch.randn(300, generator=gen).requires_grad_()
    x = torch.randn(4, 48, generator=gen)
    got = onednn_linear(x, w, b)
    got.sum().backward()
    gb = b.grad.clone()
    b.grad = None
    want = F.linear(x, w, b)
    want.sum().backward()
    assert _close(got, want) and _close(gb, b.grad)
    with torch.no_grad():
        assert _close(onednn_linear(x, w, b), want)


def _llama(vocab: int, dtype=torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def test_a_large_float32_head_is_switched_and_the_logits_keep_their_values():
    model = _llama(1 << 14)  # 64 x 16384 = 2**20 weights: the smallest head it takes
    ids = torch.tensor([[1, 5, 9, 200, 16000]])
    with torch.no_grad():
        before = model(ids).logits
    assert use_onednn_head(model) and use_onednn_head(model)  # the second call: already on
    assert "forward" in model.lm_head.__dict__
    assert list(dict(model.named_parameters())) == list(
        dict(_llama(1 << 14).named_parameters())
    )  # the same parameter names: weight pushes and checkpoints see no change
    with torch.no_grad():
        assert _close(model(ids).logits, before)
    # Training through it: the tied embedding gets the head's gradient as with linear.
    model.train()
    model(ids, labels=ids).loss.backward()
    got = model.lm_head.weight.grad.clone()
    plain = _llama(1 << 14).train()
    plain(ids, labels=ids).loss.backward()
    assert _close(got, plain.lm_head.weight.grad)


def test_under_autocast_the_head_is_autocasts_linear():
    model = _llama(1 << 14)
    use_onednn_head(model)
    hidden = torch.randn(1, 3, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.lm_head(hidden)
        want = F.linear(hidden, model.lm_head.weight)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_heads_it_leaves_alone(monkeypatch):
    assert not use_onednn_head(_llama(1000))  # a test model's vocabulary: too small to gain
    assert not use_onednn_head(_llama(1 << 14, torch.bfloat16))  # not float32
    replaced = _llama(1 << 14)
    replaced.lm_head.forward = lambda x: F.linear(x, replaced.lm_head.weight)
    assert not use_onednn_head(replaced)  # someone else's forward (e.g. a float32 head)
    monkeypatch.setattr(cpu_head, "ENABLED", False)
    assert not use_onednn_head(_llama(1 << 14))


def test_the_engine_switches_its_head():
    """The generator switches its head when it starts (a one-rank trainer does too:
    ``TrainerCore``), so the two compute the logits with the same kernel."""
    from forge.generation.hf_engine import HFEngine

    class Tok:
        pad_token_id = eos_token_id = 2

    model = _llama(1 << 14)
    HFEngine(model, Tok())
    assert "forward" in model.lm_head.__dict__
