"""ReplayBuffer and RewardActor behind real actor processes."""

from __future__ import annotations

import pytest

from controller import ActorError
from forge.actors.replay_buffer import ReplayBuffer, ReplayBufferConfig
from forge.actors.reward import RewardActor
from forge.rewards import ExactMatch, MathReward
from forge.types import Episode, TrainBatch


def _episode(i: int, version: int) -> Episode:
    return Episode(
        episode_id=f"e{i}",
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5 + i],
        behavior_logprobs=[-0.5, -0.25],
        reward=float(i % 2),
        policy_version=version,
        advantage=0.5,
    )


async def test_replay_buffer_actor_samples_collated_batches_and_evicts_stale():
    cfg = ReplayBufferConfig(batch_size=2, dp_size=2, max_policy_age=1, seed=3)
    buf = await ReplayBuffer.as_actor(cfg)
    assert await buf.add.call_one([_episode(i, 0) for i in range(3)]) == 3
    assert await buf.sample.call_one(0) is None  # 4 needed
    await buf.add.call_one(_episode(3, 1))
    batches = await buf.sample.call_one(1)
    assert len(batches) == 2 and all(isinstance(b, TrainBatch) for b in batches)
    assert tuple(batches[0].input_ids_bt.shape) == (2, 5)
    assert await buf.length.call_one() == 0  # used once each
    await buf.add.call_one([_episode(i, 0) for i in range(4)])
    assert await buf.evict.call_one(2) == 4  # age 2 > max_policy_age 1
    metrics = await buf.metrics.call_one()
    assert metrics["replay/evicted_stale"] == 4


async def test_replay_buffer_sample_and_take_wait_for_adds():
    import asyncio
    import time

    buf = await ReplayBuffer.as_actor(ReplayBufferConfig(batch_size=4, max_policy_age=0))
    waiting = buf.sample.call_one(0, wait_s=10.0)  # answered when the 4th episode lands

    async def add_later():
        for i in range(4):
            await asyncio.sleep(0.05)
            await buf.add.call_one(_episode(i, 0))

    t = time.perf_counter()
    batches, _ = await asyncio.gather(waiting, add_later())
    assert batches[0].input_ids_bt.shape[0] == 4 and time.perf_counter() - t < 5.0
    t = time.perf_counter()
    assert await buf.take.call_one(0, 8, 2, wait_s=0.2) is None  # empty: gives up in time
    assert 0.15 < time.perf_counter() - t < 5.0
    await buf.add.call_one([_episode(i, 0) for i in range(3)])
    part = await buf.take.call_one(0, 8, 2)
    assert part.input_ids_bt.shape[0] == 3 and await buf.length.call_one() == 0


async def test_replay_buffer_state_round_trip_through_the_actor():
    cfg = ReplayBufferConfig(batch_size=2, max_resample_count=1, collate=False, seed=7)
    a = await ReplayBuffer.as_actor(cfg)
    await a.add.call_one([_episode(i, 0) for i in range(5)])
    state = await a.state_dict.call_one()
    b = await ReplayBuffer.as_actor(cfg)
    await b.load_state_dict.call_one(state)
    for _ in range(3):
        sa, sb = await a.sample.call_one(0), await b.sample.call_one(0)
        assert [e.episode_id for e in sa[0]] == [e.episode_id for e in sb[0]]


async def test_reward_actor_components_and_errors():
    r = await RewardActor.as_actor([MathReward(), ExactMatch()], weights=[1.0, 0.5])
    res = await r.evaluate_response.call_one("2+2?", "The answer is \\boxed{4}", "4")
    assert res.components["math"] == 1.0
    (exact_name,) = [n for n in res.components if n != "math"]
    assert res.components[exact_name] == 0.0  # the whole response is not "4"
    assert res.total == 1.0
    batch = await r.evaluate_batch.call_one([("q", "\\boxed{3}", "3"), ("q", "\\boxed{5}", "3")])
    assert [b.components["math"] for b in batch] == [1.0, 0.0]

    def broken(prompt, response, target):
        raise RuntimeError("judge offline")

    bad = await RewardActor.as_actor([broken])
    with pytest.raises(ActorError, match="broken.*judge offline"):
        await bad.evaluate_response.call_one("q", "r", "t")
    with pytest.raises(ActorError, match="at least one reward"):
        await RewardActor.as_actor([])
