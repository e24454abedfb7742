"""Services over real processes: replicas are processes, deaths by signal are seen, requests
fail over, replicas restart, scale and shut down. Routing logic (routers, sessions, the
concurrency cap, failover rules, option checks) is tested in-process on
``controller.testing.FakeService`` in tests/unit/test_service_routing.py."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from controller import ActorError, CallTimeoutError, Service, ServiceUnavailable, shutdown
from controller._runtime import get_runtime
from tests.helpers import wait_dead
from tests.integration.controller.conftest_backends import backend_fixture  # noqa: E402
from tests.integration.controller.service_actors import Echo, StartsOnce

backend = backend_fixture


@pytest.fixture(autouse=True)
def _on_every_backend(backend):
    """The whole service suite runs on the local backend and on Monarch proc meshes."""
    return backend


def replica_pids(svc: Service) -> dict[int, int]:
    return {i: m["pids"][0] for i, m in svc.metrics().items() if m["pids"]}


# A restart spawns a process that imports torch; on 2 loaded cores (CI's slow tier runs
# these beside whole training runs) a Ray replica took over 10 s to come back.
RESTART_S = 60.0


async def wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_round_robin_across_three_replicas():
    svc = await Echo.options(num_replicas=3).as_service()
    pids = [await svc.pid.route() for _ in range(6)]
    assert len(set(pids)) == 3
    assert pids[:3] == pids[3:]
    assert set(pids) == set(replica_pids(svc).values())
    assert svc in get_runtime().services
    assert all(m["requests_ok"] == 2 and m["state"] == "healthy" for m in svc.metrics().values())


def test_sync_get_works():
    svc = Echo.options(num_replicas=2).as_service().get(timeout=60)
    assert svc.echo.route(5).get(timeout=10) == 5
    assert sorted(svc.echo.fanout(1).get(timeout=10)) == [1, 1]
    svc.shutdown().get(timeout=10)
    shutdown().get(timeout=10)


async def test_route_paths_and_request_counts():
    """A one-process replica is called straight (the fast path); a replica of two processes
    and a call with ``timeout=`` take the general path. Each gives rank 0's value, and every
    route is counted as completed or failed."""
    one = await Echo.options(num_replicas=1).as_service()
    assert await one.echo.route(3) == 3
    with pytest.raises(CallTimeoutError):
        await one.slow_pid.route(30.0, timeout=0.2)
    with pytest.raises(ActorError):
        await one.fail.route("boom")
    assert one.request_counts() == {
        "sent": 3,
        "retried": 0,
        "completed": 1,
        "failed": 2,
        "cancelled": 0,
    }
    m = one.metrics()[0]
    assert (m["requests_ok"], m["requests_failed"], m["in_flight"]) == (1, 2, 0)
    assert m["state"] == "healthy"

    two = await Echo.options(num_replicas=2, procs=2).as_service()
    rank0 = [m["pids"][0] for _, m in sorted(two.metrics().items())]
    assert [await two.pid.route() for _ in range(2)] == rank0
    assert await two.echo.route(7, timeout=10) == 7
    assert two.request_counts()["completed"] == 3
    await one.shutdown()
    await two.shutdown()


async def test_replica_restarts_after_death_and_calls_on_recover():
    svc = await Echo.options(health_poll_rate=0.05).as_service()
    old = await svc.pid.route()
    assert not await svc.was_recovered.route()
    os.kill(old, signal.SIGKILL)
    await wait_until(lambda: svc.metrics()[0]["state"] != "healthy", 10.0)
    await wait_until(
        lambda: svc.metrics()[0]["state"] == "healthy" and replica_pids(svc)[0] != old, RESTART_S
    )
    new = await svc.pid.route()
    assert new != old and new == replica_pids(svc)[0]
    assert await svc.was_recovered.route()
    assert svc.metrics()[0]["restarts"] == 1


async def test_300_routes_survive_a_replica_kill():
    svc = await Echo.options(num_replicas=3).as_service()
    victim = replica_pids(svc)[1]
    calls = [svc.echo.route(i, delay=0.02).start() for i in range(300)]
    await asyncio.sleep(0.1)
    os.kill(victim, signal.SIGKILL)
    assert await asyncio.gather(*calls) == list(range(300))
    m = svc.metrics()
    assert sum(r["requests_ok"] for r in m.values()) == 300
    assert m[1]["requests_failed"] >= 1  # the kill landed mid-traffic


async def test_fanout_skips_a_replica_killed_mid_call():
    svc = await Echo.options(num_replicas=3).as_service()
    assert sorted(await svc.echo.fanout(7)) == [7, 7, 7]
    victim = replica_pids(svc)[2]
    calls = [svc.echo.fanout_by_replica(i, delay=0.3).start() for i in range(10)]
    await asyncio.sleep(0.1)
    os.kill(victim, signal.SIGKILL)
    for i, got in enumerate(await asyncio.gather(*calls)):
        assert got == {0: i, 1: i}
    assert len(await svc.echo.fanout(1)) >= 2


async def test_service_unavailable_when_restarts_keep_failing(tmp_path):
    marker = str(tmp_path / "refuse")
    svc = await StartsOnce.options(health_poll_rate=0.05, unavailable_timeout=0.5).as_service(
        marker, False
    )
    pid = await svc.pid.route()
    open(marker, "w").close()
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: svc.metrics()[0]["state"] != "healthy", 10.0)
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match="'StartsOnce' has no healthy replica"):
        await svc.pid.route()
    assert 0.45 <= time.monotonic() - t0 < 5
    await wait_until(lambda: "refusing to start" in (svc.metrics()[0]["last_error"] or ""), 10)
    os.unlink(marker)  # the next restart attempt succeeds
    await wait_until(lambda: svc.metrics()[0]["state"] == "healthy", RESTART_S)
    assert await svc.pid.route() != pid


async def test_failed_replica_start_stops_the_others(tmp_path):
    marker = tmp_path / "claimed"
    with pytest.raises(ActorError, match="refusing to start"):
        await StartsOnce.options(num_replicas=2).as_service(str(marker), True)
    started = int(marker.read_text())
    assert wait_dead([started], 5.0) == []


async def test_scale_up_and_drain():
    svc = await Echo.as_service()
    await svc.scale(3)
    assert len({await svc.pid.route() for _ in range(3)}) == 3
    pids = replica_pids(svc)
    slow = svc.slow_pid.route(0.5).start()  # replica 0 (round robin wrapped around)
    await svc.scale(1)
    assert await slow == pids[0]
    assert list(svc.metrics()) == [0]
    assert wait_dead([pids[1], pids[2]], 5.0) == []
    assert await svc.pid.route() == pids[0]


@pytest.mark.parametrize("after_s", [0.0, 0.5])
async def test_shutdown_during_a_restart_leaves_no_process(after_s):
    """A replica restarting when the service shuts down: the restart is cancelled
    mid-spawn and must stop what it started before shutdown returns."""
    svc = await Echo.options(num_replicas=2, health_poll_rate=0.05).as_service()
    pids = list(replica_pids(svc).values())
    os.kill(pids[1], signal.SIGKILL)
    await wait_until(lambda: svc.metrics()[1]["state"] != "healthy", 5.0)
    await asyncio.sleep(after_s)  # the new process is starting, or setting up
    await svc.shutdown()
    assert get_runtime().proc_meshes == [] and not get_runtime().local_procs
    assert wait_dead(pids, 5.0) == []


async def test_no_process_left_after_shutdown():
    svc = await Echo.options(num_replicas=3, health_poll_rate=0.05).as_service()
    pids = list(replica_pids(svc).values())
    os.kill(pids[0], signal.SIGKILL)
    await wait_until(lambda: replica_pids(svc)[0] != pids[0], RESTART_S)
    await wait_until(lambda: svc.metrics()[0]["state"] == "healthy", RESTART_S)
    pids += list(replica_pids(svc).values())
    await svc.shutdown()
    assert svc not in get_runtime().services
    assert all(m["state"] == "stopped" for m in svc.metrics().values())
    assert wait_dead(pids, 5.0) == []
    with pytest.raises(ServiceUnavailable, match="shut down"):
        await svc.pid.route()
