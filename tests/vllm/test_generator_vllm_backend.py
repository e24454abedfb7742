"""The Generator's vllm backend on the small preset: batched calls, a weight update, logprobs
against the HF model (scripts/test_vllm.sh runs it)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from forge.generation.hf_weights import load_in_place
from forge.models import load_model
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig
from tests.integration.actors.test_generator import _max_logprob_diff, _perturbed, _spawn


async def test_vllm_backend_generates_updates_and_matches_logprobs(tmp_path_factory):
    pytest.importorskip("vllm")
    from forge.models import ensure_tiny_model

    # vLLM's CPU attention needs head size >= 32: the "small" preset has 32.
    model_dir = str(ensure_tiny_model("small", cache_dir=tmp_path_factory.mktemp("vllm-models")))
    prefix = f"gentest-{uuid.uuid4().hex[:8]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    engine_kwargs = {"kv_cache_memory_bytes": 256 * 2**20, "max_model_len": 512}
    try:
        gen = await _spawn(
            model_dir,
            backend="vllm",
            weights=WeightTransportConfig(prefix=prefix),
            engine_kwargs=engine_kwargs,
        )
        calls = [
            gen.generate.call_one(f"question {i}:", n=2, max_tokens=16, temperature=t, seed=i)
            for i, t in enumerate([1.0, 0.7, 1.0])
        ]
        results = await asyncio.gather(*calls)
        [chat] = await gen.generate.call_one([{"role": "user", "content": "hi"}], max_tokens=8)
        assert chat.prompt.endswith("<|im_start|>assistant\n")
        assert (await gen.stats.call_one())["max_batch_rows"] > 2

        model = load_model(model_dir)
        assert [len(cs) for cs in results] == [2, 2, 2]
        completions = [c for cs in results for c in cs]
        assert all(c.generator_version == 0 and c.logprobs for c in completions)
        diff_v0 = _max_logprob_diff(model, completions, [1.0, 1.0, 0.7, 0.7, 1.0, 1.0])

        v1 = _perturbed(model_dir, seed=1)
        assert await gen.update_weights.call_one(handle=store.push(v1, 1)) == 1
        [after] = await gen.generate.call_one("question 0:", max_tokens=16, seed=0)
        load_in_place(model, v1)
        diff_v1 = _max_logprob_diff(model, [after], [1.0])
        print(f"vllm: max |generator - token_logprobs| v0 {diff_v0:.2e}, v1 {diff_v1:.2e}")
        assert after.generator_version == 1
        assert diff_v0 < 1e-4 and diff_v1 < 1e-4
    finally:
        store.close()
