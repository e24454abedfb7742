"""Long decodes' weights laid out once per version for oneDNN
(forge/generation/packed_weights.py): the same tokens and logprobs as ``F.linear``, layouts
made only when a decode is long enough, once per weight version, and never stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from forge.generation import HFEngine, packed_weights
from forge.generation.packed_weights import DecodePacker
from forge.models import load_model, load_tokenizer, make_tiny_model
from forge.types import SamplingParams

pytestmark = pytest.mark.skipif(not packed_weights.available(), reason="no oneDNN in torch")

PROMPTS = ["Once upon a time", "The cat sat", "1 2 3 4"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def small_layers(monkeypatch):
    """The tiny model's layers count as large; 8 tokens to go count as a long decode."""
    monkeypatch.setattr(packed_weights, "MIN_WEIGHT_ELEMENTS", 1)
    monkeypatch.setattr(packed_weights, "MIN_TOKENS", 8)


def _generate(engine: HFEngine, max_tokens: int):
    params = SamplingParams(n=4, max_tokens=max_tokens, seed=3, ignore_eos=True)
    return engine.generate([(p, params) for p in PROMPTS])


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= 1e-5 * (float(b.abs().max()) + 1.0))


def test_a_layer_with_a_layout_computes_linear(small_layers):
    torch.manual_seed(0)
    for bias in (False, True):
        model = torch.nn.Sequential(torch.nn.Linear(48, 96, bias=bias))
        packer = DecodePacker(model)
        assert len(packer.layers) == 1
        x = torch.randn(2, 5, 48)
        want = F.linear(x, model[0].weight, model[0].bias)
        with torch.no_grad(), packer.active(tokens_left=100) as on:
            got = model(x[:, 1:4])  # a strided input too
            assert on and packer.packs == 1
        assert got.shape == (2, 3, 96) and _close(got, want[:, 1:4])
        # With autograd on the layer is linear's (nothing laid out, a graph kept).
        with packer.active(tokens_left=100):
            y = model(x)
        assert y.requires_grad and packer.packs == 1


def test_long_decodes_use_layouts_with_the_same_tokens_and_logprobs(model_dir, small_layers):
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    engine = HFEngine(model, tok, max_batch_size=16)
    n_layers = len(engine._packer.layers)
    assert n_layers > 0 and not engine._packer.holding
    got = _generate(engine, max_tokens=12)
    assert engine._packer.packs == n_layers  # laid out once, used for every step after
    short = HFEngine(model, tok, max_batch_size=16)
    _generate(short, max_tokens=7)  # under MIN_TOKENS: no layouts made
    assert short._packer.packs == 0

    packed_weights.ENABLED = False
    try:
        plain = HFEngine(load_model(model_dir), tok, max_batch_size=16)
        assert not plain._packer
        want = _generate(plain, max_tokens=12)
    finally:
        packed_weights.ENABLED = True
    for cs, ws in zip(got, want):
        for c, w in zip(cs, ws):
            assert c.token_ids == w.token_ids
            assert c.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_new_weights_are_laid_out_again(model_dir, small_layers):
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    engine = HFEngine(model, tok, max_batch_size=16)
    n_layers = len(engine._packer.layers)
    _generate(engine, max_tokens=10)
    assert engine._packer.packs == n_layers
    # Weights changed in place without a version bump: the layouts' keys no longer match.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    changed = _generate(engine, max_tokens=10)
    assert engine._packer.packs == 2 * n_layers
    # A new version drops the layouts (their memory with them).
    engine.version = 1
    assert not engine._packer.holding
    packed_weights.ENABLED = False
    try:
        plain = HFEngine(model, tok, max_batch_size=16)
        want = _generate(plain, max_tokens=10)
    finally:
        packed_weights.ENABLED = True
    assert [c.token_ids for cs in changed for c in cs] == [c.token_ids for cs in want for c in cs]
