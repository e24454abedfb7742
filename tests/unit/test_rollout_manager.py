"""RolloutManager: bounded asynchrony, over-sampling budget with filters, partial rollouts."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from forge.rollout import RolloutManager, nonzero_variance
from forge.types import Episode


def group(rewards: list[float], version: int = 0) -> list[Episode]:
    return [Episode(f"e{i}", [1], [2], [0.0], r, version) for i, r in enumerate(rewards)]


class Source:
    """Scripted groups; each produce() takes one, optionally waiting on a gate."""

    def __init__(self, rewards_seq, gate: asyncio.Event | None = None):
        self.seq = iter(rewards_seq)
        self.gate = gate
        self.started = 0

    async def produce(self):
        self.started += 1
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        return group(next(self.seq))


async def settle(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_credits_bound_the_groups_ahead_of_the_trainer():
    kept: list = []
    src = Source(itertools.repeat([0.0, 1.0]))

    async def consume(g):
        kept.append(g)

    m = RolloutManager(src.produce, consume, groups_per_step=3, max_policy_age=1, concurrency=8)
    m.start()
    await settle()
    assert len(kept) == 6  # groups_per_step * (max_policy_age + 1), then they wait
    m.advance(1)
    await settle()
    assert len(kept) == 9
    await m.stop()


async def test_filtered_groups_are_replaced_within_the_budget():
    kept: list = []
    # 2 groups a step, budget 2x = 4 attempts: 2 rejected groups are replaced, then the
    # budget is spent and the next rejected group is kept anyway (counted).
    seq = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    src = Source(seq)

    async def consume(g):
        kept.append([e.reward for e in g])

    record: dict[str, list[float]] = {}
    m = RolloutManager(
        src.produce,
        consume,
        groups_per_step=2,
        max_policy_age=0,
        concurrency=1,
        filter_fn=nonzero_variance,
        over_sampling_factor=1.5,
        record=lambda k, v: record.setdefault(k, []).extend(v),
    )
    m.start()
    await settle()
    # attempts: [1,1] rejected (1/3), [0,1] kept (2/3), [0,0] rejected (3/3 = budget),
    # [0,0] over budget -> kept; two kept groups fill the step's credits.
    assert kept == [[0.0, 1.0], [0.0, 0.0]]
    assert m.counts["filtered"] == 2 and m.counts["kept_over_budget"] == 1
    assert sum(record["rollout/filtered_groups"]) == 2
    await m.stop()


async def test_groups_in_flight_across_an_update_carry_over_or_drop():
    for partial, expect_kept in ((True, 1), (False, 0)):
        gate = asyncio.Event()
        src = Source([[0.0, 1.0]], gate)
        kept: list = []

        async def consume(g, kept=kept):
            kept.append(g)

        m = RolloutManager(
            src.produce,
            consume,
            groups_per_step=1,
            max_policy_age=1,
            concurrency=1,
            partial=partial,
        )
        m.start()
        await settle()
        assert src.started == 1
        m.advance(1)  # the weights move on while the group is being generated
        gate.set()
        await settle()
        assert m.counts["carried_over"] == 1
        assert len(kept) == expect_kept and m.counts["dropped"] == 1 - expect_kept
        await m.stop()


async def test_groups_born_too_old_give_their_credit_back_and_a_starved_run_is_unstuck():
    """A replica restarted on version 0 while the run is at 5 makes groups no batch can use:
    they never reach the buffer (which would evict them and keep their credits), and when
    the credits are spent anyway (groups the buffer evicted later) ``unstick`` hands out a
    step's worth, only while nothing is in flight."""
    kept: list = []
    versions = itertools.chain([0, 0], itertools.repeat(5))
    record: dict[str, list[float]] = {}

    async def produce():
        await asyncio.sleep(0)
        return group([0.0, 1.0], version=next(versions))

    async def consume(g):
        kept.append(g[0].policy_version)

    m = RolloutManager(
        produce,
        consume,
        groups_per_step=2,
        max_policy_age=1,
        concurrency=2,
        record=lambda k, v: record.setdefault(k, []).extend(v),
    )
    m.version = 5
    m.start()
    await settle()
    assert kept == [5, 5, 5, 5] and m.counts["stale"] == 2, (kept, m.counts)
    assert record["rollout/stale_groups"] == [1.0, 1.0]
    # the credits are spent (4 groups, as if the buffer lost them): every loop waits for one
    assert m.unstick() is True and m.counts["refilled"] == 1
    await settle()
    assert kept == [5, 5, 5, 5, 5, 5]
    assert m.unstick() is True  # again nothing in flight: it may hand out more
    await m.stop()


async def test_unstick_does_nothing_while_a_group_is_being_made():
    gate = asyncio.Event()
    src = Source(itertools.repeat([0.0, 1.0]), gate=gate)
    m = RolloutManager(
        src.produce, lambda g: asyncio.sleep(0), groups_per_step=1, max_policy_age=0, concurrency=2
    )
    m.start()
    await settle()
    assert src.started == 1  # one credit: one loop generates, the other waits
    assert m.unstick() is False and m.counts["refilled"] == 0
    await m.stop()


async def test_a_crashed_loop_is_reported():
    async def produce():
        raise RuntimeError("generator exploded")

    async def consume(g):
        pass

    m = RolloutManager(produce, consume, groups_per_step=1, concurrency=1)
    m.start()
    await settle()
    with pytest.raises(RuntimeError, match="a rollout loop failed") as e:
        m.check()
    assert "generator exploded" in str(e.value.__cause__)
    await m.stop()


def test_bad_arguments():
    async def f():
        return None

    with pytest.raises(ValueError, match="over_sampling_factor must be >= 1"):
        RolloutManager(f, f, groups_per_step=1, over_sampling_factor=0.5)
    with pytest.raises(ValueError, match="groups_per_step >= 1"):
        RolloutManager(f, f, groups_per_step=0)


class _Call:
    def __init__(self, fn):
        self.fn = fn

    async def call(self, *args):
        return self.fn(*args)

    async def fanout_by_replica(self, *args):
        return self.fn(*args)


class _Item:
    def __init__(self, value):
        self.value = value

    def item(self, procs=0):
        return self.value


async def test_a_weight_load_that_fails_in_the_background_fails_the_batch_wait_at_once():
    """With overlap the next push (which would raise the load's error) waits for a batch that
    the failed load's missing credits never let come: the manager's check raises it instead."""
    from types import SimpleNamespace

    from forge.run import WeightSync

    def broken(version, handle):
        raise ConnectionError("replica 1 left the group")

    handle = SimpleNamespace(transport="shm", nbytes=10)
    trainer = SimpleNamespace(push_weights=_Call(lambda v: _Item(handle)))
    generator = SimpleNamespace(update_weights=_Call(broken))
    manager = RolloutManager(Source([[1.0]]).produce, lambda g: asyncio.sleep(0), groups_per_step=1)
    sync = WeightSync(trainer, generator, on_served=manager.advance, on_failed=manager.fail)
    manager.check()
    await sync.push(1)
    await settle()
    with pytest.raises(RuntimeError, match="loading weight version 1 on the generators") as e:
        manager.check()
    assert isinstance(e.value.__cause__, ConnectionError)
    with pytest.raises(ConnectionError):  # and the next push still raises it too
        await sync.push(2)
