"""Prefix reuse in HFEngine: a conversation's next turn prefills only its new tokens, and the
results (tokens for a seed, logprobs) equal those of an engine without the cache."""

from __future__ import annotations

import copy

import pytest
import torch

from forge.generation import HFEngine
from forge.generation.prefix_cache import PrefixCache
from forge.models import load_model, load_tokenizer, make_tiny_model
from forge.types import SamplingParams

# ---- the LRU on its own ----------------------------------------------------------------------


def _kv(n: int):
    return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]


def test_longest_exact_prefix_lru_by_tokens_and_reset():
    cache = PrefixCache(max_tokens=10, version=3)
    cache.store((1, 2), _kv(2))
    cache.store((1, 2, 3, 4), _kv(4))
    cache.store((9, 2, 3), _kv(3))
    assert cache.lookup((1, 2, 3, 4, 5)).key == (1, 2, 3, 4)  # longest match
    assert cache.lookup((1, 2, 3)).key == (1, 2)  # (1, 2, 3, 4) is longer than the prompt
    assert cache.lookup((1, 2, 3, 4)).key == (1, 2, 3, 4)  # a key may equal the prompt
    assert cache.lookup((2, 2, 3, 4)) is None and cache.lookup((1, 3)) is None
    assert cache.tokens == 9
    cache.store((5, 6), _kv(2))  # 11 > 10: the least recently stored entry goes
    assert cache.lookup((1, 2, 7)) is None and (cache.tokens, cache.evictions) == (9, 1)
    cache.store(tuple(range(11)), _kv(11))  # longer than the whole budget: not kept
    assert len(cache) == 3
    cache.discard((5, 6))
    assert cache.tokens == 7
    cache.reset(version=4)
    assert (len(cache), cache.tokens, cache.version) == (0, 0, 4)
    assert not PrefixCache(0).enabled and not PrefixCache(0).fits(1)
    with pytest.raises(ValueError, match=">= 0"):
        PrefixCache(-1)


# ---- the engine on a real tiny model ----------------------------------------------------------


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_model(path), load_tokenizer(path)


def _engines(model, tok, max_batch_size=32):
    on = HFEngine(model, tok, max_batch_size=max_batch_size, prefix_cache_tokens=4096)
    off = HFEngine(model, tok, max_batch_size=max_batch_size, prefix_cache_tokens=0)
    return on, off


def _assert_same(got, want):
    for cs_got, cs_want in zip(got, want, strict=True):
        for a, b in zip(cs_got, cs_want, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            assert (a.text, a.stop_reason) == (b.text, b.stop_reason)


def _play(engine, tok, turns: int):
    """Four conversations of different lengths (rows 0 and 2 greedy, 1 and 3 seeded
    sampling), each turn played as one batch; observations differ in length too, so the hit
    rows of one admission have different new suffixes."""
    convs = [tok(f"{'talk ' * (2 * i + 1)}now")["input_ids"] for i in range(4)]
    history = []
    for t in range(turns):
        requests = [
            (ids, SamplingParams(max_tokens=3 + 2 * i, temperature=i % 2, top_k=50, seed=i + t))
            for i, ids in enumerate(convs)
        ]
        results = engine.generate(requests)
        history.append(results)
        convs = [
            ids + cs[0].token_ids + tok(f" obs {'x' * i}{t}:")["input_ids"]
            for i, (ids, cs) in enumerate(zip(convs, results))
        ]
    return history


@pytest.mark.parametrize("max_batch_size", [32, 3])  # 3: staggered admissions, merges
def test_multi_turn_results_equal_without_cache(model_and_tokenizer, max_batch_size):
    model, tok = model_and_tokenizer
    on, off = _engines(model, tok, max_batch_size)
    turns = 3
    for got, want in zip(_play(on, tok, turns), _play(off, tok, turns)):
        _assert_same(got, want)
    c = on.counters
    assert (c["prefix_hits"], c["prefix_misses"]) == (4 * (turns - 1), 4)
    assert c["prefix_reused_tokens"] > c["prefill_tokens"] / 2
    assert c["prefill_tokens"] + c["prefix_reused_tokens"] == off.counters["prefill_tokens"]
    assert on.prefix_cache_stats()["entries"] == 4  # each conversation's latest turn


def test_hit_and_miss_in_one_admission_and_siblings_share_a_hit(model_and_tokenizer):
    model, tok = model_and_tokenizer
    on, off = _engines(model, tok)
    first = tok("A first question, rather long")["input_ids"]
    p1 = SamplingParams(max_tokens=6, seed=1)
    results = {}
    for name, engine in (("on", on), ("off", off)):
        [[c]] = engine.generate([(first, p1)])
        follow = first + c.token_ids + tok(" and then?")["input_ids"]
        # prompt + sampled[:-1] is exactly a kept sequence: it reuses all but one position
        exact = first + c.token_ids[:-1]
        results[name] = engine.generate(
            [
                (follow, SamplingParams(n=2, max_tokens=8, seed=2)),
                ("a fresh prompt", SamplingParams(max_tokens=8, seed=3)),
                (exact, SamplingParams(max_tokens=5, temperature=0)),
            ]
        )
    _assert_same(results["on"], results["off"])
    assert (on.counters["prefix_hits"], on.counters["prefix_misses"]) == (3, 2)


def test_weight_change_between_turns_invalidates_the_cache(model_and_tokenizer):
    model, tok = model_and_tokenizer
    model = copy.deepcopy(model)  # changed in place below
    on, off = _engines(model, tok)
    prompt = tok("Remember this")["input_ids"]
    params = SamplingParams(max_tokens=6, seed=4)
    [[c]] = on.generate([(prompt, params)])
    assert on.prefix_cache_stats()["entries"] == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    on.version = off.version = 1
    assert on.prefix_cache_stats()["entries"] == 0
    follow = prompt + c.token_ids + tok(" next")["input_ids"]
    [got] = on.generate([(follow, params)])
    [want] = off.generate([(follow, params)])
    _assert_same([got], [want])
    assert on.counters["prefix_hits"] == 0 and got[0].generator_version == 1

    # A row admitted on version 1 that finishes after a bump to 2 keeps nothing.
    on.clear_prefix_cache()
    on.add_request(follow, SamplingParams(max_tokens=5, temperature=0))
    on.step()
    on.version = 2
    while on.has_work():
        on.step()
    assert on.prefix_cache_stats()["entries"] == 0
