"""token_logprobs / pad_and_stack: hand-computed values, padding invariance, chunking."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.models import (
    load_model,
    make_tiny_model,
    pad_and_stack,
    pad_response_values,
    position_ids_from_mask,
    token_logprobs,
)


class BigramLM(torch.nn.Module):
    """Fake causal LM whose next-token logits depend only on the current token."""

    def __init__(self, table_vv: torch.Tensor) -> None:
        super().__init__()
        self.table_vv = table_vv
        self.config = SimpleNamespace()

    def forward(self, input_ids, attention_mask, position_ids):
        return SimpleNamespace(logits=self.table_vv[input_ids])


# From token 0 the next-token probabilities are [1/4, 1/2, 1/4]; from 1 or 2 they are uniform.
TABLE = torch.log(torch.tensor([[1.0, 2.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))


def test_hand_computed_logprobs_with_right_padding():
    ids_bt = torch.tensor([[0, 1, 2], [0, 0, 0]])
    mask_bt = torch.tensor([[1, 1, 1], [1, 1, 0]])
    lp_bt = token_logprobs(BigramLM(TABLE), ids_bt, mask_bt)
    expected = torch.tensor([[0.0, math.log(0.5), math.log(1 / 3)], [0.0, math.log(0.25), 0.0]])
    torch.testing.assert_close(lp_bt, expected)


def test_temperature_scales_logits():
    ids_bt, mask_bt = torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.long)
    lp = token_logprobs(BigramLM(TABLE), ids_bt, mask_bt, temperature=2.0)[0, 1]
    # logits / 2 = log(sqrt([1, 2, 1])): p(1) = sqrt(2) / (2 + sqrt(2))
    assert lp.item() == pytest.approx(math.log(math.sqrt(2) / (2 + math.sqrt(2))), abs=1e-6)
    greedy = token_logprobs(BigramLM(TABLE), ids_bt, mask_bt, temperature=0.0)[0, 1]
    assert greedy.item() == pytest.approx(math.log(0.5), abs=1e-6)  # temperature 0 -> 1


def test_left_padding_first_real_token_is_zero():
    ids_bt = torch.tensor([[2, 0, 1]])
    mask_bt = torch.tensor([[0, 1, 1]])
    lp_bt = token_logprobs(BigramLM(TABLE), ids_bt, mask_bt)
    torch.testing.assert_close(lp_bt, torch.tensor([[0.0, 0.0, math.log(0.5)]]))


def test_position_ids_from_mask():
    mask_bt = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]])
    assert torch.equal(position_ids_from_mask(mask_bt), expected)


def test_pad_and_stack_layout():
    ids_bt, mask_bt, resp_bt = pad_and_stack([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
    assert torch.equal(ids_bt, torch.tensor([[5, 6, 8, 0], [7, 9, 10, 11]]))
    assert torch.equal(mask_bt, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    assert torch.equal(resp_bt, torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]]))
    assert ids_bt.dtype == mask_bt.dtype == torch.long and resp_bt.dtype == torch.float32
    vals_bt = pad_response_values([2, 1], [[-0.5], [-1.0, -2.0, -3.0]], width=4)
    assert torch.equal(vals_bt, torch.tensor([[0.0, 0.0, -0.5, 0.0], [0.0, -1.0, -2.0, -3.0]]))
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        pad_and_stack([[1], [2]], [[3]], pad_id=0)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return load_model(make_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_real_model_padding_invariance_and_chunking(tiny_model):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, 260, (n,), generator=g).tolist() for n in (9, 5, 7)]
    singles = [
        token_logprobs(tiny_model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0]
        for s in seqs
    ]
    ids_bt, mask_bt, _ = pad_and_stack(seqs, [[] for _ in seqs], pad_id=0)
    with torch.no_grad():
        right_bt = token_logprobs(tiny_model, ids_bt, mask_bt)
        chunked_bt = token_logprobs(tiny_model, ids_bt, mask_bt, chunk_tokens=3)
    # The same rows left-padded: flip each row's padding to the front.
    left_ids_bt = torch.stack([torch.roll(r, int((m == 0).sum())) for r, m in zip(ids_bt, mask_bt)])
    left_mask_bt = torch.stack([torch.roll(m, int((m == 0).sum())) for m in mask_bt])
    with torch.no_grad():
        left_bt = token_logprobs(tiny_model, left_ids_bt, left_mask_bt)
    torch.testing.assert_close(chunked_bt, right_bt, atol=1e-6, rtol=0)
    for i, (s, single) in enumerate(zip(seqs, singles)):
        n = len(s)
        torch.testing.assert_close(right_bt[i, :n], single, atol=1e-5, rtol=0)
        torch.testing.assert_close(left_bt[i, -n:], single, atol=1e-5, rtol=0)
        assert torch.all(right_bt[i, n:] == 0) and torch.all(left_bt[i, :-n] == 0)
        assert single[0] == 0 and torch.all(single[1:] < 0)


def test_gradients_flow(tiny_model):
    ids_bt = torch.tensor([[4, 5, 6, 7]])
    lp_bt = token_logprobs(tiny_model, ids_bt, torch.ones_like(ids_bt))
    lp_bt.sum().backward()
    grad = tiny_model.model.embed_tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    tiny_model.zero_grad(set_to_none=True)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    rows=st.integers(1, 50),
    temperature=st.sampled_from([1.0, 0.7]),
    seed=st.integers(0, 2**16),
)
def test_head_logprobs_in_pieces_equal_one_pass_with_gradients(n, rows, temperature, seed):
    """Pieces (checkpointed under grad) give one pass's values and gradients."""
    from forge.models.logprobs import head_logprobs

    g = torch.Generator().manual_seed(seed)
    vocab, dim = 11, 5
    head = torch.nn.Linear(dim, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, dim, generator=g))
    hidden = torch.randn(n, dim, generator=g)
    targets = torch.randint(0, vocab, (n,), generator=g)
    weights = torch.randn(n, generator=g)
    results = []
    for elements in (10**9, rows * vocab):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        lp = head_logprobs(head, h, targets, temperature, chunk_elements=elements)
        (lp * weights).sum().backward()
        results.append((lp.detach(), h.grad.clone(), head.weight.grad.clone()))
    for one, pieces in zip(*results):
        torch.testing.assert_close(pieces, one, rtol=1e-5, atol=1e-6)
