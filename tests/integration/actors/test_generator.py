"""Generator actor on the tiny model (CPU, real processes): sampling, batching, logprob
agreement with the trainer's recomputation, versioned weight updates (in-flight and drain)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid

import pytest
import torch

from controller import ActorError
from forge.actors.generator import Generator
from forge.generation.backend import GeneratorConfig, state_dict_checksum
from forge.generation.hf_weights import load_in_place
from forge.models import load_model, load_tokenizer, pad_and_stack, token_logprobs
from forge.types import Completion, SamplingParams
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig

LONG = 450  # greedy tokens: the tiny model's greedy output for "hello" never hits EOS


# ---- in-process pieces ------------------------------------------------------------------


# ---- actor tests --------------------------------------------------------------------------


async def _spawn(model_dir: str, **kwargs) -> Generator:
    return await Generator.options(procs=1).as_actor(GeneratorConfig(model=model_dir, **kwargs))


def _perturbed(model_dir: str, seed: int) -> dict[str, torch.Tensor]:
    """A new version: the initial weights plus noise (tied tensors stay tied)."""
    model = load_model(model_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # parameters() lists a tied tensor once
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.state_dict()


def _max_logprob_diff(model, completions: list[Completion], temperatures: list[float]) -> float:
    """Largest |generator logprob - token_logprobs recomputation| over all response tokens."""
    worst = 0.0
    for c, temp in zip(completions, temperatures):
        ids_bt, mask_bt, resp_bt = pad_and_stack([c.prompt_ids], [c.token_ids], pad_id=0)
        with torch.no_grad():
            lp_bt = token_logprobs(model, ids_bt, mask_bt, temperature=temp)
        recomputed = lp_bt[resp_bt.bool()]
        assert recomputed.shape[0] == len(c.logprobs)
        worst = max(worst, (recomputed - torch.tensor(c.logprobs)).abs().max().item())
    return worst


async def test_generate_prompts_n_stop_and_seed(tiny_model_dir):
    gen = await _spawn(tiny_model_dir, sampling=SamplingParams(max_tokens=16))
    tok = load_tokenizer(tiny_model_dir)

    outs = await gen.generate.call_one("The answer is", n=4, max_tokens=5)
    assert len(outs) == 4
    for c in outs:
        assert c.prompt_ids == tok("The answer is")["input_ids"]
        assert 1 <= len(c.token_ids) == len(c.logprobs) <= 5
        assert c.generator_version == 0 and c.stop_reason in ("stop", "length")
    assert len({tuple(c.token_ids) for c in outs}) > 1  # 4 independent samples

    chat = [{"role": "user", "content": "hi"}]
    [c] = await gen.generate.call_one(chat)
    assert c.prompt.endswith("<|im_start|>assistant\n") and len(c.token_ids) <= 16

    # A stop string cuts the text just before it.
    [full] = await gen.generate.call_one("hello", temperature=0, max_tokens=30)
    stop = next(ch for ch in full.text[2:] if ch.isprintable() and ch != "\ufffd")
    [cut] = await gen.generate.call_one("hello", temperature=0, max_tokens=30, stop=[stop])
    assert cut.stop_reason == "stop" and cut.text == full.text[: full.text.find(stop)]

    a = await gen.generate.call_one("seeded", n=2, seed=123, max_tokens=12)
    b = await gen.generate.call_one("seeded", n=2, seed=123, max_tokens=12)
    c = await gen.generate.call_one("seeded", n=2, seed=124, max_tokens=12)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]

    with pytest.raises(ActorError, match="max_new_tokens") as info:
        await gen.generate.call_one("x", max_new_tokens=3)
    assert info.value.remote_type == "builtins.TypeError"


async def test_concurrent_calls_batch_and_logprobs_match(tiny_model_dir):
    gen = await _spawn(tiny_model_dir, max_batch_size=16)
    temps = [1.0, 0.7, 1.0, 0.7, 1.0, 0.7]
    calls = [
        gen.generate.call_one(f"question {i}:", n=2, max_tokens=24, temperature=t, seed=i)
        for i, t in enumerate(temps)
    ]
    results = await asyncio.gather(*calls)
    stats = await gen.stats.call_one()
    print(f"max batch rows with 6 concurrent n=2 calls: {stats['max_batch_rows']}")
    assert stats["max_batch_rows"] > 2  # more than one request decoded together
    assert stats["requests"] == 6 and stats["completions"] == 12

    model = load_model(tiny_model_dir)  # fp32, eager: the trainer's recomputation
    completions = [c for cs in results for c in cs]
    diff = _max_logprob_diff(model, completions, [t for t in temps for _ in range(2)])
    print(f"max |generator - token_logprobs| over {len(completions)} completions: {diff:.2e}")
    assert diff < 1e-4


async def test_update_weights_exact_versions_and_errors(tiny_model_dir):
    prefix = f"gentest-{uuid.uuid4().hex[:8]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    try:
        gen = await _spawn(tiny_model_dir, weights=WeightTransportConfig(prefix=prefix))
        assert await gen.on_recover.call_one() == 0  # nothing pushed: keep the initial weights
        with pytest.raises(ActorError, match="no weight version was pushed yet"):
            await gen.update_weights.call_one()

        v1 = _perturbed(tiny_model_dir, seed=1)
        assert await gen.update_weights.call_one(handle=store.push(v1, 1)) == 1
        for name, tensor in v1.items():
            assert torch.equal(await gen.get_param.call_one(name), tensor), name
        assert await gen.state_dict_checksum.call_one() == state_dict_checksum(v1)

        v2 = _perturbed(tiny_model_dir, seed=2)
        store.push(v2, 2)
        assert await gen.update_weights.call_one(2) == 2  # looked up by prefix
        assert await gen.state_dict_checksum.call_one() == state_dict_checksum(v2)
        [c] = await gen.generate.call_one("hi", max_tokens=4)
        assert c.generator_version == 2 and await gen.get_version.call_one() == 2

        with pytest.raises(ActorError, match="weight version 7 is not in shared memory"):
            await gen.update_weights.call_one(7)
        with pytest.raises(ActorError, match="older than the version in use"):
            await gen.update_weights.call_one(1)

        store.push(_perturbed(tiny_model_dir, seed=3), 3)
        assert await gen.on_recover.call_one() == 3  # latest pushed
        assert await gen.get_version.call_one() == 3
        # A version pushed while the recovered replica waited for traffic: the first
        # requests, arriving together, share one catch-up load and all run on it.
        store.push(_perturbed(tiny_model_dir, seed=4), 4)
        first = [gen.generate.call_one(f"q{i}", max_tokens=4).start() for i in range(6)]
        outs = await asyncio.gather(*first)
        assert [c.generator_version for [c] in outs] == [4] * 6
    finally:
        store.close()


async def _wait_running(gen, rows: int = 1) -> None:
    for _ in range(2000):
        if (await gen.stats.call_one())["running_rows"] >= rows:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the long generation never started")


async def test_in_flight_and_drain_updates_keep_versions_apart(tiny_model_dir):
    prefix = f"gentest-{uuid.uuid4().hex[:8]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=3)
    try:
        gen = await _spawn(tiny_model_dir, weights=WeightTransportConfig(prefix=prefix))
        greedy = {"temperature": 0, "max_tokens": LONG}

        # In-flight: the running request finishes on v0, a new one runs on v1 meanwhile.
        long0 = asyncio.ensure_future(gen.generate.call_one("hello", **greedy))
        await _wait_running(gen)
        v1 = _perturbed(tiny_model_dir, seed=1)
        store.push(v1, 1)
        assert await gen.update_weights.call_one(1) == 1
        [new] = await gen.generate.call_one("hello", temperature=0, max_tokens=20)
        [old] = await long0
        stats = await gen.stats.call_one()
        assert stats["in_flight_updates"] == 1 and stats["max_lanes"] == 2
        assert stats["lanes"] == 1  # the v0 lane is gone once its request finished
        assert (old.generator_version, new.generator_version) == (0, 1)
        assert len(old.token_ids) == LONG
        # Each completion's logprobs are exactly those of its own version's weights: no mixing.
        model = load_model(tiny_model_dir)
        diff_v0 = _max_logprob_diff(model, [old], [1.0])
        load_in_place(model, v1)
        diff_v1 = _max_logprob_diff(model, [new], [1.0])
        print(f"in-flight update: max logprob diff v0 {diff_v0:.2e}, v1 {diff_v1:.2e}")
        assert diff_v0 < 1e-4 and diff_v1 < 1e-4
        assert _max_logprob_diff(model, [old], [1.0]) > 1e-2  # v1 would not explain `old`

        # Drain: the update returns only once the running request is done; no second lane.
        long1 = asyncio.ensure_future(gen.generate.call_one("hello", **greedy))
        await _wait_running(gen)
        store.push(_perturbed(tiny_model_dir, seed=2), 2)
        assert await gen.update_weights.call_one(2, mode="drain") == 2
        assert (await gen.stats.call_one())["running_rows"] == 0
        [old] = await long1
        [new] = await gen.generate.call_one("hi", max_tokens=4)
        assert (old.generator_version, new.generator_version) == (1, 2)
        assert (await gen.stats.call_one())["in_flight_updates"] == 1
    finally:
        store.close()


def _locked_by_a_reader(path: str) -> bool:
    """Whether some process holds a shared lock on ``path`` (a lease on that version)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


async def test_setup_errors_name_the_problem(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown generator backend 'nope'"):
        GeneratorConfig(model=tiny_model_dir, backend="nope")  # before anything spawns
    missing = os.path.join(tmp_path, "no-such-model")
    with pytest.raises(ActorError, match="no model directory at"):
        await _spawn(missing)
