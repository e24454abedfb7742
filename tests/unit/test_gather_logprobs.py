"""gather_logprobs (the fused cross-entropy form): equal to log_softmax + gather in float64,
the same gradient, any leading shape, and out-of-range targets raise."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.models import gather_logprobs


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None]).squeeze(-1)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    vocab=st.integers(1, 40),
    scale=st.floats(0.1, 30.0),
    seed=st.integers(0, 2**16),
)
def test_equals_log_softmax_and_gather_with_its_gradient(shape, vocab, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, vocab, generator=gen) * scale).requires_grad_(True)
    targets = torch.randint(0, vocab, tuple(shape), generator=gen)
    weights = torch.randn(tuple(shape), generator=gen)
    lp = gather_logprobs(logits, targets)
    assert lp.shape == targets.shape and lp.dtype == torch.float32
    (grad,) = torch.autograd.grad((lp * weights).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_(True)
    ref = _reference(ref_logits, targets)
    (ref_grad,) = torch.autograd.grad((ref * weights.double()).sum(), ref_logits)
    torch.testing.assert_close(lp.double(), ref, atol=1e-5 * max(1.0, scale), rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-5, rtol=1e-5)
    assert (lp <= 1e-6).all()  # a logprob is never positive


def test_hand_computed():
    # logits log([1, 2, 1]): p = [1/4, 1/2, 1/4]
    logits = torch.log(torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]))
    lp = gather_logprobs(logits, torch.tensor([1, 2]))
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.5, 0.25])))


@pytest.mark.parametrize("bad", [-1, -100, 3])
def test_an_out_of_range_target_raises(bad):
    with pytest.raises(IndexError, match="out of bounds"):
        gather_logprobs(torch.zeros(2, 3), torch.tensor([0, bad]))
