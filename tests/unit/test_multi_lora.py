"""Many adapters on one hf generator (``lora_mode: multi``): rows of different adapters (and
of the base) batched together each sample with their own adapter's weights, a new version
loads into a slot of its own while requests on the old one finish on it, and errors name
what is wrong."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("peft")

from forge.generation.backend import GeneratorConfig  # noqa: E402
from forge.generation.hf_backend import HFBackend  # noqa: E402
from forge.training import TrainerConfig, TrainerCore  # noqa: E402
from forge.training.trainer_config import LoraConfig  # noqa: E402
from forge.types import SamplingParams  # noqa: E402

PROMPT = [5, 9, 13, 21]


def _trainer(model: str, seed: int, rank: int, targets: tuple[str, ...]) -> TrainerCore:
    core = TrainerCore(
        TrainerConfig(model=model, seed=seed, lora=LoraConfig(rank=rank, target_modules=targets))
    )
    with torch.no_grad():  # a trained-looking adapter: B is zero at initialisation
        for name, p in core.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return core


def _trainer_logprobs(core: TrainerCore, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([PROMPT + tokens])
        return core.logprobs(ids, torch.ones_like(ids))[0, len(PROMPT) :]


async def _multi(model: str) -> HFBackend:
    backend = HFBackend(GeneratorConfig(model=model, lora_mode="multi"))
    await backend.start()
    return backend


def test_each_row_samples_with_its_own_adapter(tiny_model):
    a = _trainer(tiny_model, 1, 8, ("q_proj", "v_proj", "lm_head"))
    b = _trainer(tiny_model, 2, 4, ("o_proj", "down_proj"))

    async def go():
        backend = await _multi(tiny_model)
        try:
            await backend.load_adapter("a", 1, a.push_state_dict())
            await backend.load_adapter("b", 3, b.push_state_dict())
            params = SamplingParams(n=2, max_tokens=6, seed=3)
            return await asyncio.gather(
                backend.generate(PROMPT, params, adapter="a"),
                backend.generate(PROMPT, params, adapter="b"),
                backend.generate(PROMPT, params),
            ), backend.stats()
        finally:
            await backend.close()

    (out_a, out_b, out_base), stats = asyncio.run(go())
    assert stats["max_batch_rows"] == 6  # one batch: both adapters and the base
    for core, outs, name, version in ((a, out_a, "a", 1), (b, out_b, "b", 3)):
        for c in outs:
            assert (c.adapter, c.generator_version) == (name, version)
            lp = _trainer_logprobs(core, c.token_ids)
            torch.testing.assert_close(lp, torch.tensor(c.logprobs), atol=1e-4, rtol=0)
    assert all(c.adapter is None and c.generator_version == 0 for c in out_base)
    assert out_a[0].token_ids != out_b[0].token_ids or out_a[1].token_ids != out_b[1].token_ids


def test_a_new_version_loads_beside_running_requests(tiny_model):
    a = _trainer(tiny_model, 1, 4, ("q_proj", "v_proj"))

    async def go():
        backend = await _multi(tiny_model)
        try:
            await backend.load_adapter("a", 1, a.push_state_dict())
            long = asyncio.ensure_future(
                backend.generate(PROMPT, SamplingParams(max_tokens=40, seed=7), adapter="a")
            )
            while backend.stats()["running_rows"] == 0:
                await asyncio.sleep(0.01)
            await backend.load_adapter("a", 2, a.push_state_dict())
            slots_while_running = backend.stats()["adapter_slots"]
            short = await backend.generate(PROMPT, SamplingParams(max_tokens=2), adapter="a")
            old = await long
            return old, short, slots_while_running, backend.stats()
        finally:
            await backend.close()

    old, short, slots_while_running, stats = asyncio.run(go())
    assert old[0].generator_version == 1 and short[0].generator_version == 2
    assert slots_while_running == 2 and stats["adapter_slots"] == 1  # v1's slot recycled
    assert stats["adapters"] == {"a": 2}


def test_errors_name_the_adapter(tiny_model):
    a = _trainer(tiny_model, 1, 4, ("q_proj",))

    async def go():
        backend = await _multi(tiny_model)
        try:
            with pytest.raises(ValueError, match="'x' is not loaded"):
                await backend.generate(PROMPT, SamplingParams(max_tokens=2), adapter="x")
            await backend.load_adapter("a", 2, a.push_state_dict())
            with pytest.raises(ValueError, match="not newer than the loaded 2"):
                await backend.load_adapter("a", 2, a.push_state_dict())
            with pytest.raises(ValueError, match="load_adapter"):
                await backend.update_weights(a.push_state_dict(), 5, "in_flight")
        finally:
            await backend.close()

    asyncio.run(go())
    single = HFBackend(GeneratorConfig(model=tiny_model))
    with pytest.raises(ValueError, match="needs lora_mode: multi"):
        asyncio.run(single.load_adapter("a", 1, a.push_state_dict()))


def test_prompt_logprobs_use_the_adapter(tiny_model):
    a = _trainer(tiny_model, 1, 4, ("q_proj", "lm_head"))
    tokens = [7, 30, 44, 2]

    async def go():
        backend = await _multi(tiny_model)
        try:
            await backend.load_adapter("a", 1, a.push_state_dict())
            return (
                await backend.prompt_logprobs(PROMPT + tokens, "a"),
                await backend.prompt_logprobs(PROMPT + tokens),
            )
        finally:
            await backend.close()

    with_a, base = asyncio.run(go())
    assert with_a[0] != with_a[0]  # NaN: the first token has no context
    expected = _trainer_logprobs(a, tokens)
    torch.testing.assert_close(torch.tensor(with_a[len(PROMPT) :]), expected, atol=1e-4, rtol=0)
    assert base[len(PROMPT) :] != pytest.approx(with_a[len(PROMPT) :], abs=1e-3)
