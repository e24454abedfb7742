"""The Monarch backend (FORGE_BACKEND=monarch): the same actors, placed on Monarch proc meshes.

Real Monarch processes on this host (torchmonarch's local host mesh), each running a bootstrap
actor that starts a Forge worker listening on authenticated TCP. Multi-host placement (SLURM,
Kubernetes) is not exercised here; see docs/multihost.md.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("monarch.actor", reason="needs torchmonarch (pip install 'forge[monarch]')")

from controller import ActorDiedError, ActorError, shutdown  # noqa: E402
from controller import _serialization as ser  # noqa: E402
from controller._runtime import get_runtime  # noqa: E402
from tests.helpers import REPO, script_env, wait_dead, write_script  # noqa: E402
from tests.integration.controller.actors import Caller, Counter, InitFails, Tensors  # noqa: E402
from tests.integration.controller.conftest_backends import backend_fixture  # noqa: E402

backend = backend_fixture  # the parametrized ``backend`` fixture: local, then monarch

pytestmark = pytest.mark.monarch


@pytest.fixture(autouse=True)
def _monarch_backend(monkeypatch):
    monkeypatch.setenv("FORGE_BACKEND", "monarch")


async def test_adverbs_on_a_two_proc_mesh():
    c = await Counter.options(procs=2).as_actor(10)
    assert all(info.address.startswith("tcp:127.0.0.1:") for info in c._infos)
    assert (await c.incr.call(5)).values() == [15, 15]
    assert await c.slice(procs=1).incr.call_one(2) == 17
    assert await c.value.choose() in (15, 17)
    streamed = sorted([v async for v in c.value.stream()])
    assert streamed == [15, 17]
    assert c.incr.broadcast(100) is None  # fire-and-forget: poll until it has landed
    for _ in range(100):
        if (await c.value.call()).values() == [115, 117]:
            break
        await asyncio.sleep(0.02)
    assert (await c.history.call()).values() == [[5, 100], [5, 2, 100]]


async def test_actor_in_a_monarch_worker_calls_another_mesh():
    """Worker-to-worker calls over TCP, authenticated with the session secret."""
    c = await Counter.options(procs=2).as_actor(1)
    caller = await Caller.as_actor()
    assert await caller.call_other.call_one(c, 3) == [4, 4]


async def test_mixed_sync_and_async_endpoints():
    """Monarch 0.7.0 refuses such classes; Forge actors on it still mix them freely."""
    c = await Counter.options(procs=2).as_actor()
    where = (await c.where.call()).values()  # sync endpoint: runs in the actor's thread
    assert [w["rank"] for w in where] == [0, 1]
    assert [w["pid"] for w in where] == c.pids
    assert all(w["thread"].endswith("-sync_0") for w in where)
    assert [w["world"] for w in where] == ["2", "2"]
    assert await c.slice(procs=0).incr.call_one() == 1  # async endpoint on the same actor


async def test_endpoint_exception_carries_remote_traceback():
    c = await Counter.as_actor()
    with pytest.raises(ActorError) as info:
        await c.fail.call_one("no such key")
    err = info.value
    assert err.remote_type == "builtins.KeyError" and "no such key" in err.remote_message
    assert "raise KeyError(msg)" in err.remote_traceback
    assert isinstance(err.exception, KeyError)
    assert await c.incr.call_one() == 1  # the actor keeps serving


async def test_tensor_round_trip_travels_in_band():
    torch = pytest.importorskip("torch")
    t = await Tensors.as_actor()
    x = torch.randn(512, 512)  # 1 MiB: the local backend would use shared memory
    before = set(os.listdir(ser.SHM_DIR)) if ser.SHM_DIR else set()
    back = await t.roundtrip.call_one(x)
    plus = await t.add_one.call_one(x)
    assert torch.equal(back, x) and torch.equal(plus, x + 1)
    assert await t.checksum.call_one(x) == pytest.approx(float(x.double().sum()))
    if ser.SHM_DIR:  # workers may be on other hosts: no shared-memory payload was made
        new = {n for n in set(os.listdir(ser.SHM_DIR)) - before if n.startswith(ser.shm_prefix())}
        assert new == set()


async def test_sigkill_of_a_worker_fails_calls_fast():
    c = await Counter.options(procs=2).as_actor()
    victim = c.pids[0]
    pending = c.slice(procs=0).sleep.call_one(30).start()
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(ActorDiedError) as info:
        await pending
    assert time.monotonic() - t0 < 2.0
    err = info.value
    assert err.rank == 0 and err.pid == victim and err.signal == signal.SIGKILL
    with pytest.raises(ActorDiedError):
        await c.slice(procs=0).value.call_one()
    assert await c.slice(procs=1).incr.call_one() == 1  # the other rank keeps serving


async def test_shutdown_leaves_no_process_behind():
    c = await Counter.options(procs=2).as_actor()
    pm = c._proc_mesh
    pids = c.pids + pm.monarch_pids
    assert len(set(pids)) == 4
    await shutdown()
    assert wait_dead(pids, 5.0) == []
    assert get_runtime().proc_meshes == [] and not get_runtime().local_procs


CONTROLLER = """
import asyncio
from tests.integration.controller.actors import Counter

async def main():
    c = await Counter.options(procs=2).as_actor()
    print("PIDS", *(c.pids + c._proc_mesh.monarch_pids), flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_no_orphans_when_the_controller_is_killed(tmp_path):
    """Monarch takes its processes down with the controller; each worker's lifeline to its
    Monarch process takes the worker along."""
    env = script_env(FORGE_BACKEND="monarch")
    proc = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, CONTROLLER))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(REPO),
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]
        assert len(set(pids)) == 4
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert wait_dead(pids, 5.0) == []


async def test_failed_constructor_stops_the_mesh():
    with pytest.raises(ActorError, match="bad constructor argument"):
        await InitFails.options(procs=2).as_actor()
    assert get_runtime().proc_meshes == []


async def test_several_hosts_need_a_host_mesh():
    with pytest.raises(ValueError, match="use_host_mesh"):
        await Counter.options(hosts=2).as_actor()


async def test_same_program_on_each_backend(backend):
    c = await Counter.options(procs=2).as_actor(1)
    scheme = "unix:" if backend == "local" else "tcp:"
    assert all(info.address.startswith(scheme) for info in c._infos)
    assert (await c.incr.call()).values() == [2, 2]
    assert await c.value.choose() == 2
