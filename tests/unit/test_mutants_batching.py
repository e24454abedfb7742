"""The trainer's batching helpers against brute force and their contracts (the mutation pass,
docs/rl_maths.md): micro-batch cuts that are optimal, token caps packed tight, rows kept in
order, denominators, metric folding and the zero-advantage bookkeeping."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.training.micro_batches import length_cuts, micro_rows, token_cap
from forge.training.trainer_core import (
    ADDITIVE_METRICS,
    MAX_METRICS,
    _over_trained_rows,
    fold_metrics,
    loss_denominator,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


def _cost(lengths, cuts, cost, prefixes=None, keys=None) -> int:
    """Positions computed by parts cut at ``cuts``: per part its rows (distinct ``keys``) x
    its longest row, each distinct prefix once, plus ``cost``."""
    total = 0
    for a, b in zip([0, *cuts], [*cuts, len(lengths)]):
        rows = b - a if keys is None else len(set(keys[a:b]))
        shared = 0 if prefixes is None else sum(dict(prefixes[a:b]).values())
        total += cost + shared + rows * max(lengths[a:b])
    return total


def _best(lengths, cost, prefixes=None, keys=None) -> int:
    n = len(lengths)
    return min(
        _cost(lengths, list(cuts), cost, prefixes, keys)
        for k in range(n)
        for cuts in itertools.combinations(range(1, n), k)
    )


sorted_lengths = st.lists(st.integers(1, 40), min_size=1, max_size=8).map(sorted)


@SETTINGS
@given(sorted_lengths, st.integers(0, 60), st.data())
def test_length_cuts_are_optimal_against_every_partition(lengths, cost, data):
    n = len(lengths)
    prefixes = data.draw(
        st.none() | st.lists(st.sampled_from([("a", 5), ("b", 17)]), min_size=n, max_size=n)
    )
    keys = data.draw(st.none() | st.lists(st.integers(0, 2), min_size=n, max_size=n))
    cuts = length_cuts(lengths, cost, prefixes, keys)
    assert cuts == sorted(set(cuts)) and all(0 < c < n for c in cuts)
    assert _cost(lengths, cuts, cost, prefixes, keys) == _best(lengths, cost, prefixes, keys)


def test_length_cuts_on_a_hand_checked_case():
    # [1, 1, 9, 9] at cost 2: apart 2 + 2 + 2 + 18 = 24 against 2 + 36 = 38 together
    assert length_cuts([1, 1, 9, 9], 2) == [2]
    # a shared prefix of 30 paid twice when split: 24 + 60 against 38 + 30
    assert length_cuts([1, 1, 9, 9], 2, [("p", 30)] * 4) == []
    # at cost 0 every row apart is cheapest (1 + 2 + 3 against 2 x 2 + 3 or 3 x 3)
    assert length_cuts([1, 2, 3], 0) == [1, 2]
    # one position decides: apart 1 + 1 + 1 + 3 = 6 against 1 + 2 x 3 = 7
    assert length_cuts([1, 3], 1) == [1]
    # past 128 rows the cuts fall on blocks of ceil(n / 128) rows: 2 rows at n = 129
    assert length_cuts(list(range(1, 130)), 0)[:3] == [2, 4, 6]


@SETTINGS
@given(st.lists(st.integers(0, 30), min_size=1, max_size=12), st.integers(1, 60))
def test_token_cap_pieces_keep_order_and_are_packed_tight(lengths, cap):
    # lengths of 0: rows whose every position is a shared prefix cost nothing of their own
    rows_m = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(len(lengths)))
    pieces = token_cap(rows_m, lengths, cap)
    assert torch.equal(torch.cat(pieces), rows_m)
    for i, piece in enumerate(pieces):
        size = len(piece) * max(lengths[r] for r in piece.tolist())
        assert len(piece) >= 1 and (len(piece) == 1 or size <= cap)
        if i + 1 < len(pieces):  # the next row would not have fit
            grown = piece.tolist() + [int(pieces[i + 1][0])]
            assert len(grown) * max(lengths[r] for r in grown) > cap


@SETTINGS
@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(1, 7), st.booleans())
def test_micro_rows_cover_every_row_once_in_chunks_of_the_micro_batch_size(lengths, per, bucket):
    parts = micro_rows(lengths, per, "cpu", 10 if bucket else None)
    rows = torch.cat(parts).tolist()
    assert sorted(rows) == list(range(len(lengths)))
    assert [len(p) for p in parts[:-1]] == [per] * (len(parts) - 1) and 1 <= len(parts[-1]) <= per
    order = sorted(range(len(lengths)), key=lengths.__getitem__) if bucket else rows
    assert rows == order  # batch order, or (buckets) ascending length


@SETTINGS
@given(st.lists(st.integers(1, 50), min_size=2, max_size=16), st.integers(0, 40), st.data())
def test_micro_rows_without_a_size_cut_the_sorted_rows_where_length_cuts_says(lengths, cost, data):
    n = len(lengths)
    prefixes = data.draw(
        st.none() | st.lists(st.sampled_from([("a", 5), ("b", 60)]), min_size=n, max_size=n)
    )
    keys = data.draw(st.none() | st.lists(st.integers(0, 1), min_size=n, max_size=n))
    parts = micro_rows(lengths, None, "cpu", cost, prefixes, keys)
    order = sorted(range(n), key=lengths.__getitem__)
    assert torch.cat(parts).tolist() == order
    cuts = list(itertools.accumulate(len(p) for p in parts))[:-1]
    pre = None if prefixes is None else [prefixes[i] for i in order]
    k = None if keys is None else [keys[i] for i in order]
    assert cuts == length_cuts([lengths[i] for i in order], cost, pre, k)


def test_micro_rows_pay_a_shared_prefix_once_per_part():
    lengths = [1, 1, 9, 9]
    assert len(micro_rows(lengths, None, "cpu", 2)) == 2  # 24 positions apart, 38 together
    assert len(micro_rows(lengths, None, "cpu", 2, [("p", 30)] * 4)) == 1  # 84 against 68
    # three copies of one short row count once: 11 + 19 = 30 apart against 10 + 2 x 9 = 28
    # together (distinct rows: 13 + 19 = 32 against 46)
    assert len(micro_rows([1, 1, 1, 9], None, "cpu", 10)) == 2
    assert len(micro_rows([1, 1, 1, 9], None, "cpu", 10, None, ["a", "a", "a", "b"])) == 1


def test_micro_rows_with_no_size_and_no_buckets_are_one_part_in_batch_order():
    assert [p.tolist() for p in micro_rows([5, 40, 6], None, "cpu")] == [[0, 1, 2]]


def test_token_cap_fills_a_piece_up_to_exactly_the_cap():
    assert [p.tolist() for p in token_cap(torch.arange(3), [3, 3, 3], 6)] == [[0, 1], [2]]


def test_token_cap_counts_rows_of_length_zero_as_no_positions():
    pieces = token_cap(torch.arange(3), [0, 0, 5], 1)
    assert [p.tolist() for p in pieces] == [[0, 1], [2]]


def test_loss_denominators_are_additive_over_rows():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1.0], [1, 0, 0, 0]])
    for mode in ("token_mean", "seq_mean", "dr_grpo"):
        whole = loss_denominator(mask, mode)
        assert whole == sum(loss_denominator(mask[i : i + 1], mode) for i in range(4))
    assert [loss_denominator(mask, m) for m in ("token_mean", "seq_mean", "dr_grpo")] == [7, 3, 4]


def test_fold_metrics_weighs_averages_and_keeps_the_max_of_max_metrics():
    (max_key,) = MAX_METRICS
    sums: dict[str, float] = {}
    fold_metrics(sums, {"loss": 2.0, "ratio_mean": 1.5, max_key: 0.25}, 0.75)
    fold_metrics(sums, {"loss": 4.0, "ratio_mean": 0.5, max_key: 0.125}, 0.25)
    assert sums == {"loss": 2.5, "ratio_mean": 1.25, max_key: 0.25}
    fold_metrics(sums, {max_key: 3.0}, 0.5)
    assert sums[max_key] == 3.0


def test_over_trained_rows_renormalises_averages_only():
    (max_key,) = MAX_METRICS
    additive = sorted(ADDITIVE_METRICS)
    sums = {**{k: 0.5 for k in additive}, "ratio_mean": 0.25, max_key: 0.75}
    out = _over_trained_rows(sums, 0.25, torch.nn.Linear(2, 2))
    assert out == {**{k: 0.5 for k in additive}, "ratio_mean": 1.0, max_key: 0.75}


def test_over_trained_rows_when_none_trained_gives_zero_gradients():
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    model.weight.grad = None
    out = _over_trained_rows({"loss": 9.0, "ratio_mean": 1.0}, 0.0, model)
    assert out == {"loss": 0.0, "policy_loss": 0.0}
    assert torch.equal(model.weight.grad, torch.zeros(2, 3)) and model.bias.grad is None
    kept = torch.ones(2, 3)
    model.weight.grad = kept
    _over_trained_rows({}, 0.0, model)
    assert model.weight.grad is kept  # an existing gradient is left as it is
