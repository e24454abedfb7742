"""The Ray backend (FORGE_BACKEND=ray): the same actors, placed by Ray, on a Ray instance the
controller starts on this host (one per test process). The service suites run on it too
(``tests/integration/controller/test_services*.py``, the ``backend`` fixture's Ray case);
hosts that share nothing are ``tests/multihost/``. In the slow tier: starting Ray and its
per-rank actors made this module ~30 s of the fast tier, 24 s of them in
``test_no_orphans_when_the_controller_is_killed`` and ``test_adverbs_and_rank_environment``
(2026-11-26, loaded machine, ~80 s loaded)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'forge[ray]')")

import ray  # noqa: E402

from controller import ActorDiedError, ActorError, shutdown  # noqa: E402
from controller._runtime import get_runtime  # noqa: E402
from tests.helpers import REPO, script_env, wait_dead, write_script  # noqa: E402
from tests.integration.controller.actors import Caller, Counter, InitFails  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(autouse=True)
def _ray_backend(monkeypatch):
    monkeypatch.setenv("FORGE_BACKEND", "ray")


@pytest.fixture(autouse=True, scope="module")
def _stop_ray_after_the_module():
    """One Ray instance for the module; stopped after it, so that it does not load the
    machine under the tests that follow in this process."""
    yield
    ray.shutdown()


async def test_adverbs_and_rank_environment():
    c = await Counter.options(procs=2).as_actor(10)
    assert all(info.address.startswith("tcp:") for info in c._infos)
    assert (await c.incr.call(5)).values() == [15, 15]
    assert await c.slice(procs=1).incr.call_one(2) == 17
    assert sorted([v async for v in c.value.stream()]) == [15, 17]
    where = (await c.where.call()).values()
    assert [w["rank"] for w in where] == [0, 1] and [w["world"] for w in where] == ["2", "2"]
    pm = c._proc_mesh
    assert len(set(pm.node_ids)) == 1 and len(set(pm.host_pids)) == 2
    group = ray.util.placement_group_table()
    mine = [g for g in group.values() if g["name"].startswith(f"forge-{pm.name}-")]
    assert len(mine) == 1 and mine[0]["state"] == "CREATED"
    assert mine[0]["strategy"] == "STRICT_PACK" and len(mine[0]["bundles"]) == 1


async def test_worker_to_worker_calls():
    c = await Counter.options(procs=2).as_actor(1)
    caller = await Caller.as_actor()
    assert await caller.call_other.call_one(c, 3) == [4, 4]


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
    assert info.value.pid == victim and info.value.signal == signal.SIGKILL
    assert await c.slice(procs=1).incr.call_one() == 1  # the other rank keeps serving


async def test_a_rank_host_that_ray_reports_dead_fails_calls_at_once():
    """What a lost node looks like from the controller: Ray says the rank's actor is gone.
    The call in flight fails now (not when TCP gives up) and the worker follows its host."""
    c = await Counter.options(procs=2).as_actor()
    proc = c._proc_mesh._procs[0]
    pending = c.slice(procs=0).sleep.call_one(30).start()
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    ray.kill(proc.actor, no_restart=True)
    with pytest.raises(ActorDiedError, match="Ray actor is gone"):
        await pending
    assert time.monotonic() - t0 < 5.0
    assert wait_dead([proc.pid, proc.host_pid], 5.0) == []


async def test_shutdown_leaves_no_process_or_placement_group():
    c = await Counter.options(procs=2).as_actor()
    pm = c._proc_mesh
    pids = c.pids + pm.host_pids
    await shutdown()
    assert wait_dead(pids, 10.0) == []
    assert get_runtime().proc_meshes == [] and not get_runtime().local_procs
    groups = ray.util.placement_group_table().values()
    assert [g["state"] for g in groups if g["name"].startswith(f"forge-{pm.name}-")] == ["REMOVED"]


async def test_failed_constructor_stops_the_mesh():
    with pytest.raises(ActorError, match="bad constructor argument"):
        await InitFails.options(procs=2).as_actor()
    assert get_runtime().proc_meshes == []


async def test_no_room_is_a_clear_error_within_its_bound(monkeypatch):
    import controller._ray as forge_ray

    monkeypatch.setattr(forge_ray, "PLACE_TIMEOUT_S", 3.0)
    monkeypatch.setenv("FORGE_RAY_CPUS", "100000")
    with pytest.raises(Exception, match="no room for mesh .* FORGE_RAY_CPUS"):
        await Counter.as_actor()
    assert get_runtime().proc_meshes == []


def test_bad_cpus_setting_is_an_error(monkeypatch):
    from controller import env_vars

    monkeypatch.setenv("FORGE_RAY_CPUS", "zero")
    with pytest.raises(ValueError, match="FORGE_RAY_CPUS must be a positive number"):
        env_vars.ray_cpus()


CONTROLLER = """
import asyncio
import ray
from tests.integration.controller.actors import Counter

async def main():
    c = await Counter.options(procs=2).as_actor()
    ray_pids = [int(p) for p in __import__("subprocess").run(
        ["pgrep", "-f", "-s", str(__import__("os").getsid(0)), "raylet|gcs_server"],
        capture_output=True, text=True).stdout.split()]
    print("PIDS", *(c.pids + c._proc_mesh.host_pids + ray_pids), flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_no_orphans_when_the_controller_is_killed(tmp_path):
    """The controller's own Ray instance, its actors and their workers all go with it."""
    proc = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, CONTROLLER))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(REPO),
        env=script_env(FORGE_BACKEND="ray"),
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]
        assert len(set(pids)) >= 6, pids  # 2 workers, 2 rank hosts, raylet, gcs
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert wait_dead(pids, 30.0) == []
    left = subprocess.run(
        ["pgrep", "-s", str(proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert wait_dead([int(p) for p in left], 30.0) == [], "processes of the session remain"


CLOSE = """
import signal, threading
from controller._launch import WatchedProc
from controller._runtime import get_runtime

class Gone(WatchedProc):
    # a rank whose Ray actor is gone: signalling it raises as Ray does ("Can't find actor")
    def __init__(self, name):
        self.done = threading.Event()
        super().__init__(name, 0, 1, f"tcp:127.0.0.1:{name}", 1, "lost-host", lambda p: None)
    def _wait_exit(self):
        self.done.wait()
        return -9
    def _send_signal(self, sig):
        if sig == signal.SIGKILL:
            self.done.set()
        raise ValueError("Can't find actor 1234")

rt = get_runtime()
procs = [Gone("1"), Gone("2")]
for p in procs:
    rt.local_procs[p.address] = p
rt.close()
print("closed", [p.returncode for p in procs])
"""


def test_close_goes_on_past_ranks_already_gone():
    """Closing the runtime signals every rank; one whose Ray actor is gone (its host lost)
    raises, as Ray does, and close goes on to the others."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CLOSE)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "closed [-9, -9]" in out.stdout
    assert "Traceback" not in out.stderr
