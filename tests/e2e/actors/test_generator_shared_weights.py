"""The Generator computing in place on shared weights (10-18 s: two generators and four versions;
the rest of the Generator's tests are tests/integration/actors/test_generator.py)."""

from __future__ import annotations

import asyncio
import uuid

from forge.actors import Generator
from forge.generation.backend import GeneratorConfig, state_dict_checksum
from forge.run import actor_env_vars
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig
from tests.integration.actors.test_generator import (
    LONG,
    _locked_by_a_reader,
    _perturbed,
    _wait_running,
)


async def _spawn(model_dir: str, **kwargs) -> Generator:
    """A generator with one fixed torch thread: both processes then sum in the same order,
    so their logprobs can be compared bit for bit (with the host's thread budget they were
    5e-7 apart when a neighbouring test moved it, CI run40)."""
    return await Generator.options(procs=1, env_vars=actor_env_vars(1)).as_actor(
        GeneratorConfig(model=model_dir, **kwargs)
    )


async def test_shared_weights_no_copy_same_tokens_and_leases_follow_lanes(tiny_model_dir):
    prefix = f"gentest-{uuid.uuid4().hex[:8]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=3)
    try:
        weights = WeightTransportConfig(prefix=prefix)
        gen = await _spawn(tiny_model_dir, weights=weights)
        copying = await _spawn(
            tiny_model_dir, weights=WeightTransportConfig(prefix=prefix, share=False)
        )
        greedy = {"temperature": 0, "max_tokens": 40}
        h1 = store.push(_perturbed(tiny_model_dir, seed=1), 1)
        assert await gen.update_weights.call_one(handle=h1) == 1
        assert await copying.update_weights.call_one(handle=h1) == 1
        assert (await gen.stats.call_one())["shared_versions"] == [1]
        assert (await copying.stats.call_one())["shared_versions"] == []
        assert _locked_by_a_reader(h1.location)  # gen's lease on version 1
        # Computing in place gives the very tokens and logprobs of a private copy.
        [a] = await gen.generate.call_one("hello", **greedy)
        [b] = await copying.generate.call_one("hello", **greedy)
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        assert a.generator_version == 1
        assert await gen.state_dict_checksum.call_one() == state_dict_checksum(
            _perturbed(tiny_model_dir, seed=1)
        )

        # In flight: the running request keeps version 1's lease until it finishes.
        long1 = asyncio.ensure_future(
            gen.generate.call_one("hello", temperature=0, max_tokens=LONG)
        )
        await _wait_running(gen)
        h2 = store.push(_perturbed(tiny_model_dir, seed=2), 2)
        assert await gen.update_weights.call_one(handle=h2) == 2
        assert (await gen.stats.call_one())["shared_versions"] == [1, 2]
        [new] = await gen.generate.call_one("hi", max_tokens=4)
        [old] = await long1
        assert (old.generator_version, new.generator_version) == (1, 2)
        [again] = await gen.generate.call_one("hi", max_tokens=4)  # the old lane retires
        assert again.generator_version == 2
        assert (await gen.stats.call_one())["shared_versions"] == [2]
        assert not _locked_by_a_reader(h1.location) and _locked_by_a_reader(h2.location)

        # A version by number is copied: the model moves to owned tensors, the lease goes.
        store.push(_perturbed(tiny_model_dir, seed=3), 3)
        assert await gen.update_weights.call_one(3) == 3
        assert (await gen.stats.call_one())["shared_versions"] == []
        assert not _locked_by_a_reader(h2.location)
        assert await gen.state_dict_checksum.call_one() == state_dict_checksum(
            _perturbed(tiny_model_dir, seed=3)
        )
        # And back to shared, through drain mode this time.
        h4 = store.push(_perturbed(tiny_model_dir, seed=4), 4)
        assert await gen.update_weights.call_one(handle=h4, mode="drain") == 4
        assert (await gen.stats.call_one())["shared_versions"] == [4]
        [c] = await gen.generate.call_one("hi", max_tokens=4)
        assert c.generator_version == 4
    finally:
        store.close()
