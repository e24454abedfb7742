"""HFEngine and sampling: filtering on hand-made logits, stop rules, seeds, logprob agreement."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from benchmarks.decode_variants import flat_inverse_cdf
from forge.generation import HFEngine, counter_uniform, kv_cache, sample_next, top_k_top_p_mask
from forge.generation.sampling import inverse_cdf
from forge.models import load_model, load_tokenizer, make_tiny_model, pad_and_stack, token_logprobs
from forge.types import SamplingParams

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS_V = PROBS.log()


def _mask(top_k: int, top_p: float) -> list[int]:
    keep = top_k_top_p_mask(LOGITS_V[None], torch.tensor([top_k]), torch.tensor([top_p]))
    return keep[0].nonzero().flatten().tolist()


@pytest.mark.parametrize(
    "top_k, top_p, kept",
    [
        (0, 1.0, [0, 1, 2, 3]),
        (2, 1.0, [0, 1]),
        (1, 1.0, [0]),
        (0, 0.5, [0]),  # mass before token 1 is 0.5, not < 0.5
        (0, 0.7, [0, 1]),
        (0, 0.81, [0, 1, 2]),  # mass before token 2 is 0.8
        (0, 0.84, [0, 1, 2]),
        # top-k first, then top-p on the renormalised top 3: mass before token 2 = 0.8/0.95
        (3, 0.84, [0, 1]),
        (0, 1e-6, [0]),  # the most likely token always survives
    ],
)
def test_top_k_top_p_mask(top_k, top_p, kept):
    assert _mask(top_k, top_p) == kept


def test_mask_handles_unsorted_rows_independently():
    logits_bv = torch.stack([LOGITS_V.flip(0), LOGITS_V])
    keep_bv = top_k_top_p_mask(logits_bv, torch.tensor([2, 0]), torch.tensor([1.0, 0.7]))
    assert keep_bv.tolist() == [[False, False, True, True], [True, True, False, False]]


def test_greedy_and_logprob_convention():
    logits_bv = torch.stack([LOGITS_V, LOGITS_V, LOGITS_V])
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=2.0, top_k=1),
    ]
    tokens_b, logprobs_b = sample_next(logits_bv, params, torch.rand(3, dtype=torch.float64))
    assert tokens_b.tolist() == [0, 0, 0]
    # Logprobs come from the temperature-scaled distribution before top-k filtering.
    sqrt_sum = sum(math.sqrt(p) for p in PROBS.tolist())
    expected = [math.log(0.5), math.log(0.5), math.log(math.sqrt(0.5) / sqrt_sum)]
    assert logprobs_b.tolist() == pytest.approx(expected, abs=1e-6)


def test_sampling_frequencies_respect_top_p_and_seed():
    n = 3000
    params = [SamplingParams(top_p=0.81)] * n
    uniforms_b = torch.tensor([counter_uniform(0, i) for i in range(n)], dtype=torch.float64)
    tokens_b, logprobs_b = sample_next(LOGITS_V.expand(n, 4), params, uniforms_b)
    counts = torch.bincount(tokens_b, minlength=4).tolist()
    assert counts[3] == 0
    assert counts[0] / n == pytest.approx(0.5 / 0.95, abs=0.03)
    assert logprobs_b[tokens_b == 1].unique().tolist() == pytest.approx([math.log(0.3)], abs=1e-6)
    assert torch.equal(sample_next(LOGITS_V.expand(n, 4), params, uniforms_b)[0], tokens_b)
    # Row by row, alone, each row draws what it drew in the batch.
    for i in (0, 7, 1234):
        alone = sample_next(LOGITS_V[None], params[:1], uniforms_b[i : i + 1])[0]
        assert alone.item() == tokens_b[i].item()


def test_counter_uniforms_are_uniform_and_distinct():
    us = [counter_uniform(seed, i) for seed in (0, 1, 2**62 + 5) for i in range(2000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert len(set(us)) == len(us)
    assert sum(us) / len(us) == pytest.approx(0.5, abs=0.01)
    # deciles are each ~10%
    counts = torch.bincount(torch.tensor([int(u * 10) for u in us]), minlength=10)
    assert counts.min().item() > 0.08 * len(us) and counts.max().item() < 0.12 * len(us)


def test_inverse_cdf_never_draws_a_filtered_token():
    params = [SamplingParams(top_k=2)] * 5
    edges = torch.tensor([0.0, 0.5, 0.8, 0.95, 1.0 - 2**-53], dtype=torch.float64)
    tokens_b, _ = sample_next(LOGITS_V.expand(5, 4), params, edges)
    assert set(tokens_b.tolist()) <= {0, 1}


def test_kv_cache_concat_then_select_round_trips():
    g = torch.Generator().manual_seed(0)
    a = DynamicCache([(torch.randn(2, 1, 3, 2, generator=g), torch.randn(2, 1, 3, 2, generator=g))])
    b = DynamicCache([(torch.randn(1, 1, 5, 2, generator=g), torch.randn(1, 1, 5, 2, generator=g))])
    ka, kb = a.layers[0].keys.clone(), b.layers[0].keys.clone()
    merged = kv_cache.concat_left_padded(a, b)
    assert merged.layers[0].keys.shape == (3, 1, 5, 2)
    assert torch.equal(merged.layers[0].keys[:2, :, :2], torch.zeros(2, 1, 2, 2))
    picked = kv_cache.drop_leading_columns(kv_cache.select_rows(merged, torch.tensor([1, 0])), 2)
    assert torch.equal(picked.layers[0].keys, ka.flip(0))
    assert torch.equal(kv_cache.select_rows(merged, torch.tensor([2])).layers[0].keys, kb)


# ---- engine on a real tiny model --------------------------------------------------------


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_model(path), load_tokenizer(path)


@pytest.fixture
def engine(model_and_tokenizer):
    model, tok = model_and_tokenizer
    return HFEngine(model, tok, max_batch_size=32, version=7)


CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


def test_generates_n_samples_with_max_tokens(engine):
    [a, b] = engine.generate(
        [("Once upon", SamplingParams(n=4, max_tokens=6, seed=0)), (CHAT, SamplingParams(n=1))]
    )
    assert len(a) == 4 and len(b) == 1
    for c in a:
        assert c.prompt == "Once upon" and engine.tokenizer.decode(c.prompt_ids) == "Once upon"
        assert len(c.token_ids) == len(c.logprobs) <= 6
        assert c.stop_reason == ("length" if len(c.token_ids) == 6 else "stop")
        assert c.generator_version == 7
        assert all(lp <= 0 for lp in c.logprobs)
    assert len({tuple(c.token_ids) for c in a}) > 1  # the 4 samples differ
    assert engine.counters["prefill_shared_rows"] == 3  # the 4 samples shared one prefill
    assert b[0].prompt.endswith("<|im_start|>assistant\n")


def test_common_start_prefilled_once_same_samples(model_and_tokenizer, monkeypatch):
    """Prompts that start alike (a system prompt) prefill that start once: the same tokens
    and (within float rounding) logprobs as prefilling every prompt whole."""
    from forge.generation import hf_engine

    model, tok = model_and_tokenizer
    system = [{"role": "system", "content": "You are a careful assistant who adds numbers."}]
    requests = [
        (
            system + [{"role": "user", "content": f"What is {a} + {b}?"}],
            SamplingParams(n=3, max_tokens=6, seed=a),
        )
        for a, b in [(12, 7), (3, 45), (60, 1), (9, 99)]
    ]
    on = HFEngine(model, tok, max_batch_size=32)
    got = on.generate(requests)
    assert on.counters["prefill_common_tokens"] > 0
    monkeypatch.setattr(hf_engine, "MIN_COMMON_SAVING", 10**9)
    off = HFEngine(model, tok, max_batch_size=32)
    want = off.generate(requests)
    assert off.counters["prefill_common_tokens"] == 0
    assert on.counters["prefill_tokens"] < off.counters["prefill_tokens"]
    for cs, ws in zip(got, want):
        for c, w in zip(cs, ws):
            assert c.token_ids == w.token_ids
            assert c.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_version_captured_when_request_is_added(engine):
    rid = engine.add_request("abc", SamplingParams(max_tokens=3, seed=1))
    engine.version = 8  # a weight update lands mid-flight
    done = {}
    while engine.has_work():
        done.update(engine.step())
    assert done[rid][0].generator_version == 7


def test_seed_reproducible_regardless_of_batch(engine):
    params = SamplingParams(n=2, max_tokens=12, seed=1234, top_k=40, top_p=0.9)
    [alone] = engine.generate([("Seeded prompt", params)])
    # Other requests with shorter and longer prompts and different lengths, in a batch of 3:
    # rows finish at different steps and waiting rows join the running batch mid-flight.
    small = HFEngine(engine.model, engine.tokenizer, max_batch_size=3)
    _, crowded, _ = small.generate(
        [
            ("a", SamplingParams(n=1, max_tokens=3)),
            ("Seeded prompt", params),
            ("a much longer other prompt here", SamplingParams(n=3, max_tokens=5)),
        ]
    )
    for x, y in zip(alone, crowded):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert alone[0].token_ids != alone[1].token_ids  # per-sample streams differ


def test_stop_string_truncates_text_and_keeps_completing_token(engine):
    params = SamplingParams(max_tokens=40, seed=5, temperature=0.8)
    [[full]] = engine.generate([("Stop test", params)])
    printable = [ch for ch in full.text[3:] if ch.isascii() and ch.isprintable()]
    assert printable, full.text  # this seed yields printable characters after position 3
    stop = printable[0]
    stopped_params = SamplingParams(max_tokens=40, seed=5, temperature=0.8, stop=["\x00@@", stop])
    [[cut]] = engine.generate([("Stop test", stopped_params)])
    assert cut.stop_reason == "stop"
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.token_ids)], abs=1e-5)
    assert cut.text == full.text[: full.text.index(stop)]
    decode = engine.tokenizer.decode
    assert stop in decode(cut.token_ids) and stop not in decode(cut.token_ids[:-1])


def test_eos_stops_and_is_kept(model_and_tokenizer):
    model, tok = model_and_tokenizer
    [[greedy]] = HFEngine(model, tok).generate([("xyz", SamplingParams(temperature=0))])
    first = greedy.token_ids[0]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [first]  # make the greedy token an eos id
    try:
        [[c]] = HFEngine(model, tok).generate([("xyz", SamplingParams(temperature=0))])
        ignored = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        [[long]] = HFEngine(model, tok).generate([("xyz", ignored)])
    finally:
        model.generation_config.eos_token_id = saved
    assert c.token_ids == [first] and c.stop_reason == "stop"
    # ignore_eos samples on past it, to max_tokens, the same tokens as without the eos id.
    assert long.token_ids == greedy.token_ids[:5] and long.stop_reason == "length"


def test_prompt_type_errors(engine):
    with pytest.raises(TypeError, match="string or a list of chat messages"):
        engine.generate([(42, SamplingParams())])
    with pytest.raises(ValueError, match="zero tokens"):
        engine.generate([("fine", SamplingParams()), ("", SamplingParams())])
    assert not engine.has_work()  # nothing from the failed call is left queued


def test_step_api_admits_requests_mid_flight(engine):
    pa = SamplingParams(n=2, max_tokens=10, seed=11)
    pb = SamplingParams(n=1, max_tokens=6, seed=12, temperature=0.5)
    expected_a, expected_b = engine.generate([("first request", pa), ("second, later", pb)])
    ra = engine.add_request("first request", pa)
    assert engine.step() == [] and engine.step() == []
    rb = engine.add_request("second, later", pb)  # joins the running batch
    done = {}
    while engine.has_work():
        done.update(engine.step())
    for got, want in ((done[ra], expected_a), (done[rb], expected_b)):
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
    with pytest.raises(RuntimeError, match="drain them with step"):
        engine.add_request("x", SamplingParams())
        engine.generate([("y", SamplingParams())])


@pytest.mark.parametrize("max_batch_size", [32, 3])
def test_logprobs_match_teacher_forced_recompute(engine, max_batch_size):
    """The key RL property: behaviour logprobs == trainer's recomputation (same temperature)."""
    eng = HFEngine(engine.model, engine.tokenizer, max_batch_size=max_batch_size)
    requests = [
        ("Hi", SamplingParams(n=3, max_tokens=16, temperature=1.0, seed=1)),
        (
            "A considerably longer prompt to force left padding",
            SamplingParams(n=2, max_tokens=20, temperature=0.7, top_k=30, top_p=0.9, seed=2),
        ),
        (CHAT, SamplingParams(n=2, max_tokens=12, temperature=1.3, seed=3)),
        ("Greedy", SamplingParams(n=1, max_tokens=8, temperature=0)),
    ]
    worst = 0.0
    for (_, params), comps in zip(requests, eng.generate(requests)):
        ids_bt, mask_bt, resp_bt = pad_and_stack(
            [c.prompt_ids for c in comps], [c.token_ids for c in comps], eng.pad_id
        )
        with torch.no_grad():
            lp_bt = token_logprobs(eng.model, ids_bt, mask_bt, temperature=params.temperature)
        for i, c in enumerate(comps):
            recomputed = lp_bt[i][resp_bt[i].bool()]
            worst = max(worst, (recomputed - torch.tensor(c.logprobs)).abs().max().item())
    print(f"max |engine - teacher-forced| logprob diff: {worst:.3g}")
    assert worst < 1e-4


def test_growing_layer_appends_in_place_and_survives_surgery():
    g = torch.Generator().manual_seed(1)
    k0, v0 = torch.randn(3, 2, 4, 5, generator=g), torch.randn(3, 2, 4, 5, generator=g)
    cache = kv_cache.growing_cache([(k0, v0)])
    layer = cache.layers[0]
    buffer = layer._buf_k
    steps = [torch.randn(3, 2, 1, 5, generator=g) for _ in range(40)]  # past the first capacity
    for s in steps:
        cache.update(s, s * 2, 0)
    expect_k = torch.cat([k0, *steps], dim=2)
    assert torch.equal(cache.layers[0].keys, expect_k)
    assert torch.equal(cache.layers[0].values, torch.cat([v0, *(s * 2 for s in steps)], dim=2))
    assert cache.get_seq_length() == 44 and layer._buf_k is not buffer  # grew once, kept data
    assert layer._buf_k.shape[2] >= 2 * 36  # doubled when the 37th position did not fit
    # select rows, then drop columns: views into buffers, then appending still works
    picked = kv_cache.drop_leading_columns(kv_cache.select_rows(cache, torch.tensor([2, 0])), 3)
    assert torch.equal(picked.layers[0].keys, expect_k[[2, 0], :, 3:])
    new = torch.randn(2, 2, 1, 5, generator=g)
    keys, _ = picked.update(new, new, 0)
    assert torch.equal(keys, torch.cat([expect_k[[2, 0], :, 3:], new], dim=2))
    assert torch.equal(cache.layers[0].keys, expect_k)  # the source cache is untouched
    # transformers reassigning keys (its own crop) is adopted, not overwritten
    cache.crop(-4)
    cache.update(new[:1].expand(3, -1, -1, -1), new[:1].expand(3, -1, -1, -1), 0)
    assert torch.equal(cache.layers[0].keys[:, :, :40], expect_k[:, :, :40])
    assert torch.equal(cache.layers[0].keys[:, :, 40], new[0, :, 0].expand(3, -1, -1))


def test_folded_gqa_decode_attention_equals_sdpa(model_and_tokenizer):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from forge.generation.attention import forge_eager_attention, forge_sdpa_attention

    g = torch.Generator().manual_seed(2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 4, True
    query = torch.randn(3, 8, 1, 16, generator=g)
    key, value = torch.randn(3, 2, 9, 16, generator=g), torch.randn(3, 2, 9, 16, generator=g)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[0, ..., :4] = False  # left padding
    mask[2, ..., :1] = False
    ours, _ = forge_sdpa_attention(module, query, key, value, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == ref.shape == (3, 1, 8, 16)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    # a prefill (several queries) goes through transformers' own path unchanged
    q4 = torch.randn(3, 8, 4, 16, generator=g)
    m4 = torch.ones(3, 1, 4, 9, dtype=torch.bool).tril(diagonal=5)
    ours4, _ = forge_sdpa_attention(module, q4, key, value, m4, scaling=0.25)
    ref4, _ = sdpa_attention_forward(module, q4, key, value, m4, scaling=0.25)
    assert torch.equal(ours4, ref4)

    # eager: the model's own eager function is the reference (the tiny model: 4 heads on 2 KV)
    model, _ = model_and_tokenizer
    attn = model.model.layers[0].self_attn
    eager = sys.modules[type(attn).__module__].eager_attention_forward
    q = torch.randn(3, 4, 1, 16, generator=g)
    k, v = key[:, :, :, :16], value[:, :, :, :16]
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    ours, _ = forge_eager_attention(attn, q, k, v, additive, scaling=0.25)
    ref, _ = eager(attn, q, k, v, additive, scaling=0.25)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


def test_fast_decode_attention_generates_what_plain_attention_does(tmp_path):
    path = make_tiny_model(tmp_path / "m", preset="small")  # 8 heads on 4 KV heads
    requests = [
        ("Once upon", SamplingParams(n=3, max_tokens=12, seed=5)),
        ("Hi", SamplingParams(n=2, seed=1, max_tokens=9)),
    ]
    results = {}
    for impl in ("eager", "sdpa"):
        for fast in (True, False):
            model, tok = load_model(path, attn_implementation=impl), load_tokenizer(path)
            engine = HFEngine(model, tok)
            if not fast:  # back to the implementation as loaded
                model.set_attn_implementation(impl)
                engine._fast_attention = None
            assert model.config._attn_implementation == (f"forge_{impl}" if fast else impl)
            results[impl, fast] = engine.generate(requests)
    for impl in ("eager", "sdpa"):
        for fast_out, plain_out in zip(results[impl, True], results[impl, False]):
            for a, b in zip(fast_out, plain_out):
                assert a.token_ids == b.token_ids
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.sampled_from([1, 3, 255, 256, 257, 700, 1024]),
    zeros=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_two_level_inverse_cdf_draws_what_a_flat_cumsum_draws(rows, vocab, zeros, seed):
    """``inverse_cdf`` (block sums, then one block's cumsum) against a float64 cumsum over the
    whole row: the same token, zero-probability tokens never drawn, any vocabulary size."""
    g = torch.Generator().manual_seed(seed)
    probs_bv = torch.rand(rows, vocab, generator=g) ** 4
    probs_bv[torch.rand(rows, vocab, generator=g) < zeros] = 0.0
    probs_bv[:, int(torch.randint(vocab, (1,), generator=g))] += 0.01  # never all zero
    probs_bv /= probs_bv.sum(-1, keepdim=True)
    uniforms_b = torch.rand(rows, generator=g, dtype=torch.float64)
    uniforms_b[0] = 0.0
    got = inverse_cdf(probs_bv, uniforms_b)
    assert torch.equal(got, flat_inverse_cdf(probs_bv, uniforms_b))
    assert bool((probs_bv.gather(1, got[:, None]) > 0).all())
