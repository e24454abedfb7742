"""Adverbs, value meshes, ordering and handles: real processes on this host."""

from __future__ import annotations

import asyncio

import pytest

from controller import ActorMesh, ValueMesh, this_host
from tests.helpers import pid_alive, run_script
from tests.integration.controller.actors import Caller, Counter, WithSetup
from tests.integration.controller.conftest_backends import backend_fixture

backend = backend_fixture  # the tests that take ``backend`` run on local, Ray and Monarch


async def test_call_returns_one_value_per_rank():
    c = await Counter.options(procs=3).as_actor(10)
    vm = await c.incr.call(5)
    assert isinstance(vm, ValueMesh)
    assert len(vm) == 3
    assert vm.values() == [15, 15, 15]
    where = await c.where.call()
    assert [w["rank"] for w in where.values()] == [0, 1, 2]
    assert [p.rank for p, _ in where] == [0, 1, 2]
    assert where.item(procs=2)["rank"] == 2
    assert len({w["pid"] for w in where.values()}) == 3
    assert where.item(procs=0)["size"] == {"procs": 3}
    # torch.distributed rendezvous variables
    assert [w["env_rank"] for w in where.values()] == ["0", "1", "2"]
    assert {w["world"] for w in where.values()} == {"3"}


async def test_endpoints_may_bound_their_first_wait():
    c = await Counter.options(procs=1).as_actor(0)
    assert await c.bounded_wait.call_one(0.01) == "bounded"
    await c.incr.call_one()  # the process still serves calls


async def test_concurrent_calls_await_one_shared_future():
    # Endpoints run eagerly up to their first suspension; calls that arrive together and
    # await the same pending future must all get its result (asyncio's blocking flag).
    c = await Counter.options(procs=1).as_actor(4)
    for _ in range(3):
        calls = [c.shared_wait.call_one(0.05).start() for _ in range(8)]
        assert await asyncio.gather(*calls) == [4] * 8


async def test_actor_processes_run_uvloop_when_installed():
    from controller.loops import uvloop_enabled

    c = await Counter.options(procs=1).as_actor()
    loop = await c.loop_type.call_one()
    assert loop.startswith("uvloop") == uvloop_enabled(), loop


async def test_slice_and_sizes():
    c = await Counter.options(procs=3).as_actor()
    assert c.size("procs") == 3 and len(c) == 3
    one = c.slice(procs=1)
    assert len(one) == 1
    assert await one.incr.call_one(7) == 7
    assert (await c.value.call()).values() == [0, 7, 0]
    two = c.slice(procs=slice(1, 3))
    assert (await two.value.call()).values() == [7, 0]


async def test_call_one_requires_single_rank():
    c = await Counter.options(procs=2).as_actor()
    with pytest.raises(ValueError, match="exactly one rank.*slice"):
        c.incr.call_one()


async def test_choose_prefers_least_busy():
    c = await Counter.options(procs=2).as_actor()
    slow = c.slice(procs=0).sleep.call_one(1.0).start()
    await asyncio.sleep(0.2)
    ranks = [await c.sleep.choose(0.0) for _ in range(4)]
    assert ranks == [1, 1, 1, 1]
    assert await slow == 0


async def test_broadcast_is_fire_and_forget():
    c = await Counter.options(procs=2).as_actor()
    assert c.incr.broadcast(3) is None
    for _ in range(100):
        if (await c.value.call()).values() == [3, 3]:
            break
        await asyncio.sleep(0.02)
    assert (await c.value.call()).values() == [3, 3]


async def test_stream_yields_as_ranks_finish():
    c = await Counter.options(procs=3).as_actor()
    # rank r sleeps 0.3*(2-r): rank 2 answers first.
    got = []
    async for rank in c.sleep.stream(0.0):
        got.append(rank)
    assert sorted(got) == [0, 1, 2]
    t = c.slice(procs=0).sleep.call_one(0.6).start()
    s = c.slice(procs=slice(1, 3))
    order = [r async for r in s.sleep.stream(0.05)]
    assert sorted(order) == [1, 2]
    assert await t == 0


async def test_200_concurrent_calls_keep_order_and_state():
    c = await Counter.as_actor()
    results = await asyncio.gather(*(c.incr.call_one(i) for i in range(200)))
    expected = [sum(range(i + 1)) for i in range(200)]
    assert results == expected
    assert await c.history.call_one() == list(range(200))


async def test_sync_endpoint_runs_off_the_loop():
    c = await Counter.as_actor()
    info = await c.where.call_one()
    assert info["thread"] != "MainThread"
    # a blocking def endpoint does not stall async endpoints of the same actor
    blocked = c.block.call_one(0.5).start()
    await asyncio.sleep(0.1)
    assert await c.value.call_one(timeout=0.3) == 0
    assert await blocked == 0


async def test_closures_and_lambdas_travel():
    c = await Counter.as_actor()
    k = 7
    assert await c.apply.call_one(lambda x: x * k, 6) == 42

    class Local:
        def __init__(self, v):
            self.v = v

    out = await c.echo.call_one(Local(3))
    assert out.v == 3


async def test_mesh_handle_used_inside_another_actor():
    target = await Counter.options(procs=2).as_actor()
    caller = await Caller.as_actor()
    assert await caller.call_other.call_one(target, 4) == [4, 4]
    assert await caller.call_other_sync.call_one(target) == 4
    assert (await target.value.call()).values() == [4, 4]


async def test_spawn_procs_and_spawn():
    pm = await this_host().spawn_procs(per_host={"procs": 2}, env_vars={"MY_VAR": "x"}, name="pm")
    assert pm.size("procs") == 2
    am = pm.spawn("counter", Counter, 5)
    assert isinstance(am, ActorMesh)
    assert (await am.getenv.call("MY_VAR")).values() == ["x", "x"]
    assert (await am.incr.call(1)).values() == [6, 6]
    am2 = await pm.spawn("other", Counter, 100)
    assert (await am2.value.call()).values() == [100, 100]
    await pm.stop()


async def test_setup_runs_on_every_rank():
    m = await WithSetup.options(procs=2).as_actor()
    assert (await m.is_ready.call()).values() == [True, True]


async def test_env_vars_reach_every_process_of_an_actor(backend):
    m = await Counter.options(procs=2, env_vars={"MY_VAR": "y"}).as_actor()
    assert (await m.getenv.call("MY_VAR")).values() == ["y", "y"]
    await m.shutdown()


async def test_options_are_independent():
    a = Counter.options(procs=2)
    b = Counter.options(procs=1, mesh_name="b")
    assert a._options().procs == 2 and b._options().procs == 1
    assert Counter._options().procs == 1
    ma, mb = await asyncio.gather(a.as_actor(), b.as_actor())
    assert len(ma) == 2 and len(mb) == 1


async def test_shutdown_stops_processes():
    c = await Counter.options(procs=2).as_actor()
    pids = c.pids
    await c.shutdown()
    for pid in pids:
        assert not pid_alive(pid)


def test_plain_sync_script_uses_get(tmp_path):
    out = run_script(
        tmp_path,
        """
        from controller import shutdown
        from tests.integration.controller.actors import Counter
        c = Counter.options(procs=2).as_actor(1).get(timeout=60)
        print("VALUES", c.incr.call(2).get().values())
        print("ONE", c.slice(procs=1).value.call_one().get(timeout=5))
        shutdown().get(timeout=30)
    """,
    )
    assert out.returncode == 0, out.stderr
    assert "VALUES [3, 3]" in out.stdout
    assert "ONE 3" in out.stdout


async def test_get_works_inside_a_running_loop():
    # Jupyter users may call .get() in a cell; it runs on the runtime's background loop.
    c = await Counter.as_actor(2)
    assert c.value.call_one().get(timeout=10) == 2


def test_actor_output_is_prefixed(tmp_path):
    out = run_script(
        tmp_path,
        """
        import asyncio
        from controller import Actor, endpoint, shutdown

        class Talker(Actor):
            @endpoint
            def say(self, msg):
                import sys
                print(msg, flush=True)
                print("to-stderr", file=sys.stderr, flush=True)

        async def main():
            t = await Talker.options(procs=2, mesh_name="talk").as_actor()
            await t.say.call("hello")
            await shutdown()

        asyncio.run(main())
    """,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("[talk-") and " 0/2] hello" in line for line in lines), lines
    assert any(" 1/2] hello" in line for line in lines), lines
    assert any(" 0/2] to-stderr" in line for line in out.stderr.splitlines())
