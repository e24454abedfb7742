"""The error contract: remote exceptions, dead processes, misuse, timeouts, supervision."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from controller import ActorDiedError, ActorError, CallTimeoutError, SpawnError
from tests.helpers import wait_dead
from tests.integration.controller.actors import Caller, Counter, InitFails, SetupFails


async def test_remote_exception_carries_type_message_and_traceback():
    c = await Counter.as_actor(1)
    with pytest.raises(ActorError) as info:
        await c.fail.call_one("no such key")
    err = info.value
    assert err.remote_type == "builtins.KeyError"
    assert "no such key" in err.remote_message
    assert "raise KeyError(msg)" in err.remote_traceback
    assert "actors.py" in err.remote_traceback
    assert isinstance(err.exception, KeyError)
    assert err.endpoint == "fail" and err.rank == 0
    # the actor keeps serving, with its state
    assert await c.incr.call_one() == 2


async def test_missing_and_undecorated_endpoints():
    c = await Counter.as_actor()
    with pytest.raises(AttributeError, match="not an endpoint; decorate it with @endpoint"):
        _ = c.not_an_endpoint
    with pytest.raises(AttributeError, match="has no endpoint 'nope'.*incr"):
        _ = c.nope
    with pytest.raises(TypeError, match="adverb"):
        c.incr(1)


async def test_unpicklable_argument_is_named_at_the_call_site():
    c = await Counter.as_actor()
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"positional argument 0 \(lock\)"):
        c.echo.call_one(lock)
    with pytest.raises(TypeError, match="keyword argument 'x'"):
        c.echo.call_one(x=lock)
    assert await c.value.call_one() == 0


async def test_timeout_raises_and_actor_survives():
    c = await Counter.as_actor()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await c.sleep.call_one(5.0, timeout=0.3)
    assert isinstance(info.value, CallTimeoutError)
    assert "sleep" in str(info.value) and "0.3" in str(info.value)
    assert time.monotonic() - t0 < 2
    assert await c.sleep.with_timeout(5).call_one(0.0) == 0
    # an endpoint that declares `timeout` itself receives it
    assert await c.wait_for.call_one(timeout=1.5) == 1.5


async def test_sigkill_mid_call_fails_fast_and_names_the_process():
    c = await Counter.options(procs=2).as_actor()
    victim = c.pids[0]
    pending = c.slice(procs=0).sleep.call_one(30).start()
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(ActorDiedError) as info:
        await pending
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0
    err = info.value
    assert err.rank == 0 and err.pid == victim and err.signal == signal.SIGKILL
    assert "SIGKILL" in str(err) and str(victim) in str(err) and "Counter" in str(err)
    # later calls fail at once too, and the other rank keeps serving
    with pytest.raises(ActorDiedError):
        await c.slice(procs=0).value.call_one()
    assert await c.slice(procs=1).incr.call_one() == 1


async def test_exit_code_is_reported():
    c = await Counter.as_actor()
    with pytest.raises(ActorDiedError, match="exit code 7"):
        await c.die.call_one(7)


async def test_owner_supervise_hook_sees_child_death():
    parent = await Caller.as_actor()
    (child_pid,) = await parent.spawn_child.call_one()
    await parent.kill_child.call_one()
    assert wait_dead([child_pid], 5) == []
    for _ in range(50):
        seen = await parent.failures_seen.call_one()
        if any(m.startswith("process for mesh") for m in seen):
            break
        await asyncio.sleep(0.05)
    # the death itself, and (since the kill came through a broadcast) the broadcast's failure
    deaths = [m for m in seen if m.startswith("process for mesh")]
    assert len(deaths) == 1
    assert "child" in deaths[0] and str(child_pid) in deaths[0] and "exit code 3" in deaths[0]


async def test_constructor_error_reaches_caller():
    with pytest.raises(ActorError, match="bad constructor argument"):
        await InitFails.as_actor()


async def test_setup_error_reaches_caller_and_processes_stop():
    with pytest.raises(ActorError, match="weights not found"):
        await SetupFails.options(procs=2).as_actor()


async def test_worker_that_cannot_start_gives_spawn_error():
    from controller import this_host

    with pytest.raises(SpawnError, match="exited during start-up"):
        await this_host().spawn_procs(per_host={"procs": 1}, env_vars={"FORGE_SHAPE": "not json"})


def test_bad_options():
    with pytest.raises(ValueError, match="procs"):
        Counter.options(procs=0)
    with pytest.raises(ValueError, match="as_service"):
        Counter.options(num_replicas=2).as_actor()
    with pytest.raises(TypeError, match=r"env_vars="):  # ``env`` is an RL environment
        Counter.options(env={"A": "1"})


async def test_teardown_hook_runs_on_graceful_stop(tmp_path):
    from tests.integration.controller.actors import WithTeardown

    marker = tmp_path / "torn-down"
    m = await WithTeardown.as_actor(str(marker))
    await m.shutdown()
    assert marker.read_text() == "bye"
