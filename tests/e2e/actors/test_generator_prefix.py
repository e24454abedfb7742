"""Prefix reuse through a Generator service: episodes run inside ``svc.session()`` reuse their
previous turn's KV on their replica, with teacher-forced logprobs; a weight update empties
every replica's cache."""

from __future__ import annotations

import asyncio
import uuid

import torch

from controller import session_tag
from forge.actors.generator import Generator
from forge.envs import StepResult, run_episode
from forge.generation.backend import GeneratorConfig
from forge.models import load_model, load_tokenizer, token_logprobs
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig


class EchoEnv:
    def reset(self, task):
        return [{"role": "user", "content": task}]

    def step(self, action: str) -> StepResult:
        return StepResult("go on", reward=0.0)


async def test_sessions_reuse_prefixes_until_a_weight_update(tiny_model_dir):
    prefix = f"{session_tag()}-gen-prefix-{uuid.uuid4().hex[:6]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    cfg = GeneratorConfig(model=tiny_model_dir, weights=WeightTransportConfig(prefix=prefix))
    try:
        svc = await Generator.options(num_replicas=2).as_service(cfg)
        tok = load_tokenizer(tiny_model_dir)

        async def episode(i: int):
            async with svc.session():
                return await run_episode(
                    EchoEnv(),
                    f"task {i}",
                    svc.generate.route,
                    tok,
                    max_turns=3,
                    sampling={"max_tokens": 6, "temperature": 1.0, "seed": i},
                )

        trajs = await asyncio.gather(*(episode(i) for i in range(4)))
        stats = await svc.stats.fanout()
        assert all(s["requests"] > 0 for s in stats)  # both replicas served episodes
        turns = sum(t.num_turns for t in trajs)
        assert sum(s["prefix_hits"] for s in stats) == turns - len(trajs)  # later turns hit
        assert sum(s["prefix_misses"] for s in stats) == len(trajs)
        assert all(s["prefix_cached_tokens"] > 0 for s in stats)

        model = load_model(tiny_model_dir)  # reused KV: the same logprobs as teacher forcing
        for t in trajs:
            ids_bt = torch.tensor([t.token_ids])
            with torch.no_grad():
                lp_t = token_logprobs(model, ids_bt, torch.ones_like(ids_bt), temperature=1.0)[0]
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert (lp_t[mask] - torch.tensor(t.logprobs)[mask]).abs().max().item() < 1e-4

        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        assert await svc.update_weights.fanout(1, store.push(model.state_dict(), 1)) == [1, 1]
        assert [s["prefix_cached_tokens"] for s in await svc.stats.fanout()] == [0, 0]
        # Turn 4 of an episode, on the new weights: a miss, though turn 3's KV was kept.
        [c] = await svc.generate.route(trajs[0].token_ids + tok("more")["input_ids"])
        stats = await svc.stats.fanout()
        assert sum(s["prefix_hits"] for s in stats) == turns - len(trajs)
        assert c.generator_version == 1
    finally:
        store.close()
