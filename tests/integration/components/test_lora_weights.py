"""LoRA pushes: the trainer publishes only adapter tensors; an hf generator applies them to the
base it holds (merged or unmerged) and then samples with the trainer's probabilities."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
import torch

pytest.importorskip("peft")

from forge.actors.generator import Generator  # noqa: E402
from forge.actors.trainer import Trainer  # noqa: E402
from forge.generation.backend import GeneratorConfig  # noqa: E402
from forge.generation.hf_backend import HFBackend  # noqa: E402
from forge.losses import LossConfig  # noqa: E402
from forge.models import make_tiny_model  # noqa: E402
from forge.training import OptimizerConfig, TrainerConfig, TrainerCore  # noqa: E402
from forge.training.trainer_config import LoraConfig  # noqa: E402
from forge.types import SamplingParams  # noqa: E402
from forge.weights import ADAPTER_KEY, unpack_adapter  # noqa: E402
from tests.episodes import make_batch  # noqa: E402

PROMPT = "Sum the digits of 4821."


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


def _trained_core(model: str) -> TrainerCore:
    cfg = TrainerConfig(
        model=model,
        loss=LossConfig(type="reinforce"),
        optimizer=OptimizerConfig(lr=2e-2),
        lora=LoraConfig(rank=4),
    )
    core = TrainerCore(cfg)
    for k in range(3):
        core.train_step(make_batch(model, offset=k))
    return core


def _trainer_logprobs(core: TrainerCore, prompt_ids: list[int], ids: list[int]) -> torch.Tensor:
    seq = torch.tensor([prompt_ids + ids])
    with torch.no_grad():
        lp = core.logprobs(seq, torch.ones_like(seq))
    return lp[0, len(prompt_ids) :]


@pytest.mark.parametrize("mode", ["merged", "unmerged"])
async def test_generator_applies_the_adapter_with_the_trainers_probabilities(tiny_model, mode):
    core = _trained_core(tiny_model)
    backend = HFBackend(GeneratorConfig(model=tiny_model, lora_mode=mode, max_batch_size=4))
    await backend.start()
    try:
        params = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=3)
        before = await backend.generate(PROMPT, params)
        base_sd = {k: v.clone() for k, v in backend.named_weights().items()}
        for version in (1, 2):  # a second version replaces the first, never adds to it
            if version == 2:
                core.train_step(make_batch(tiny_model, offset=5))
            await backend.update_weights(core.push_state_dict(), version, "in_flight")
            for c in await backend.generate(PROMPT, params):
                assert c.generator_version == version
                want = _trainer_logprobs(core, c.prompt_ids, c.token_ids)
                torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=2e-4)
        after = await backend.generate(PROMPT, params)
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        if mode == "unmerged":  # the base tensors were never written
            now = backend.named_weights()
            for name, t in base_sd.items():
                peft_name = re.sub(r"_proj\.(weight|bias)$", r"_proj.base_layer.\1", name)
                assert torch.equal(now[peft_name], t), name
    finally:
        await backend.close()


async def test_in_flight_adapter_update_keeps_running_requests_on_their_version(tiny_model):
    core = _trained_core(tiny_model)
    backend = HFBackend(GeneratorConfig(model=tiny_model, lora_mode="unmerged"))
    await backend.start()
    try:
        long = SamplingParams(n=1, max_tokens=200, temperature=0)  # greedy: no early EOS
        running = asyncio.ensure_future(backend.generate(PROMPT, long))
        while backend.stats()["running_rows"] == 0:
            await asyncio.sleep(0.002)
        await backend.update_weights(core.push_state_dict(), 1, "in_flight")
        new = await backend.generate(PROMPT, SamplingParams(n=1, max_tokens=20, seed=1))
        old = await running
        assert backend.stats()["in_flight_updates"] == 1
        assert old[0].generator_version == 0 and new[0].generator_version == 1
        assert len(old[0].token_ids) == 200
        want = _trainer_logprobs(core, new[0].prompt_ids, new[0].token_ids)
        torch.testing.assert_close(torch.tensor(new[0].logprobs), want, rtol=0, atol=2e-4)
    finally:
        await backend.close()


async def test_actors_push_adapter_bytes_and_generator_pulls_by_handle_or_number(tiny_model):
    prefix = f"lora{os.getpid()}"
    cfg = TrainerConfig(
        model=tiny_model,
        optimizer=OptimizerConfig(lr=2e-2),
        loss=LossConfig(type="reinforce"),
        lora=LoraConfig(rank=4),
    )
    cfg.weights.prefix = prefix
    trainer = await Trainer.as_actor(cfg)
    gen = await Generator.options(procs=1).as_actor(
        GeneratorConfig(model=tiny_model, weights={"prefix": prefix})
    )
    try:
        await trainer.train_step.call_one(make_batch(tiny_model))
        handle = await trainer.push_weights.call_one(1)
        assert handle.is_adapter
        full = await trainer.state_dict.call_one()
        spec_meta = handle.manifest[ADAPTER_KEY].nbytes
        local = TrainerCore(cfg)  # the same adapter shapes
        _, adapter = unpack_adapter(local.push_state_dict())
        adapter_bytes = sum(t.nbytes for t in adapter.values())
        assert handle.nbytes == adapter_bytes + spec_meta
        assert handle.nbytes < 0.1 * sum(t.nbytes for t in full.values())
        assert await gen.update_weights.call_one(handle=handle) == 1
        # A restarted replica pulls by number: the version says itself that it is an adapter.
        await trainer.train_step.call_one(make_batch(tiny_model, offset=1))
        await trainer.push_weights.call_one(2)
        assert await gen.update_weights.call_one(version=2) == 2
        [c] = await gen.generate.call_one(PROMPT, n=1, max_tokens=8, temperature=1.0, seed=0)
        batch_ids = torch.tensor([c.prompt_ids + c.token_ids])
        from forge.replay import collate_episodes
        from forge.types import Episode

        ep = Episode(
            episode_id="e",
            prompt_ids=c.prompt_ids,
            response_ids=c.token_ids,
            behavior_logprobs=c.logprobs,
            reward=0.0,
            policy_version=2,
        )
        lp = await trainer.logprobs.call_one(collate_episodes([ep]))
        want = lp[0, len(c.prompt_ids) : batch_ids.shape[1]]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=2e-4)
        # the merged generator's weights equal the trainer's merged view
        name = "model.layers.0.self_attn.q_proj.weight"
        got = await gen.get_param.call_one(name)
        torch.testing.assert_close(
            got, (await trainer.state_dict.call_one())[name], atol=1e-6, rtol=0
        )
    finally:
        await trainer.close.call_one()


async def test_an_adapter_for_another_base_is_refused(tiny_model, tmp_path):
    other = str(make_tiny_model(tmp_path / "other", seed=1))
    core = TrainerCore(TrainerConfig(model=tiny_model, lora=LoraConfig(rank=4)))
    backend = HFBackend(GeneratorConfig(model=other))
    await backend.start()
    try:
        with pytest.raises(ValueError, match="adapter is for base model .* but this generator"):
            await backend.update_weights(core.push_state_dict(), 1, "in_flight")
        assert backend.version == 0
    finally:
        await backend.close()
