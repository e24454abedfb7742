"""Services heal themselves: a replica whose event loop stops answering health checks is
restarted and its requests re-sent elsewhere (long work in a ``def`` endpoint is not mistaken
for a hang); a service passed to an actor routes (with the service's router) and fans out
from there, also after one of its replicas is killed. Each test runs on the local backend and on Monarch proc meshes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from controller import Service
from tests.helpers import wait_dead
from tests.integration.controller.conftest_backends import backend_fixture
from tests.integration.controller.service_actors import Caller, Echo, HighestIndexRouter

backend = backend_fixture


@pytest.fixture(autouse=True)
def _on_every_backend(backend):
    return backend


def replica_pids(svc: Service) -> dict[int, int]:
    return {i: m["pids"][0] for i, m in svc.metrics().items() if m["pids"]}


async def wait_until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_replica_with_a_blocked_loop_is_restarted_and_its_request_resent(tmp_path):
    interval, timeout = 0.3, 1.5
    svc = await Echo.options(
        num_replicas=2, health_check_interval_s=interval, health_check_timeout_s=timeout
    ).as_service()
    before = replica_pids(svc)
    marker = tmp_path / "hung"
    t0 = time.monotonic()
    # The first replica to get this call blocks its loop forever; once the health check
    # gives up on it, the request is re-sent and answered by the other replica.
    answered_by = await asyncio.wait_for(svc.hang_once.route(str(marker)), 30)
    detected_s = time.monotonic() - t0
    hung = int(marker.read_text())
    assert hung in before.values() and answered_by in before.values() and answered_by != hung
    assert timeout <= detected_s < timeout + interval + 5.0, detected_s
    assert svc.request_counts()["retried"] == 1
    idx = next(i for i, p in before.items() if p == hung)
    assert wait_dead([hung], 10.0) == []  # the stuck (live) process was stopped
    await wait_until(lambda: svc.metrics()[idx]["state"] == "healthy", 30.0)
    m = svc.metrics()[idx]
    assert m["restarts"] == 1 and "did not answer a health check" in m["last_error"]
    assert m["last_recovery_s"] is not None and m["last_recovery_s"] > 0
    assert sorted(await svc.pid.fanout()) == sorted(replica_pids(svc).values())
    print(f"blocked replica detected and request re-sent after {detected_s:.2f} s")


async def test_long_sync_endpoint_work_does_not_trip_health_checks():
    svc = await Echo.options(health_check_interval_s=0.2, health_check_timeout_s=0.5).as_service()
    pid = replica_pids(svc)[0]
    assert await svc.sync_sleep.route(3.0) == pid  # 6x the deadline, in a thread
    m = svc.metrics()[0]
    assert m["state"] == "healthy" and m["restarts"] == 0 and m["last_error"] is None


async def test_an_actor_routes_and_fans_out_through_a_service_it_was_given():
    svc = await Echo.options(num_replicas=2, health_poll_rate=0.05).as_service()
    caller = await Caller.options().as_actor()
    assert await caller.keep.call_one(svc) == "ServiceRef"
    pids = replica_pids(svc)
    assert sorted(set(await caller.route_pids.call_one(4))) == sorted(pids.values())
    assert sorted(await caller.fanout_pids.call_one()) == sorted(pids.values())
    assert await caller.route_with.call_one(svc.echo, "x") == "x"

    os.kill(pids[0], signal.SIGKILL)
    # Right after the kill the caller's routes all land on the survivor (a request that met
    # the dead replica is re-sent), and its fanout skips the dead one.
    assert set(await caller.route_pids.call_one(4)) == {pids[1]}
    assert await caller.fanout_pids.call_one() in ([pids[1]], sorted(replica_pids(svc).values()))
    await wait_until(
        lambda: svc.metrics()[0]["state"] == "healthy" and replica_pids(svc)[0] != pids[0], 30.0
    )
    fresh = replica_pids(svc)
    # The restarted replica is seen through the handle too.
    assert sorted(await caller.fanout_pids.call_one()) == sorted(fresh.values())
    assert set(await caller.route_pids.call_one(4)) == set(fresh.values())

    await svc.shutdown()
    with pytest.raises(Exception, match="shut down|no healthy replica"):
        await caller.route_pids.call_one(1)


async def test_an_actor_routes_with_the_services_router():
    """The ``ServiceRef`` an actor gets routes with the service's configured router."""
    svc = await Echo.options(num_replicas=2, router=HighestIndexRouter()).as_service()
    caller = await Caller.options().as_actor()
    await caller.keep.call_one(svc)
    last = replica_pids(svc)[1]
    assert {await svc.pid.route() for _ in range(3)} == {last}
    assert set(await caller.route_pids.call_one(4)) == {last}
