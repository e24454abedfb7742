"""Service routing, sessions, failover and fanout, on ``controller.testing.FakeService``
(the real routing core and routers, in-process) and on a ``ServiceRef`` over fake replicas.
Process behaviour (deaths by signal, restarts, health checks) is tested in
tests/integration/controller/test_services*.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller import (
    Actor,
    ActorDiedError,
    ActorError,
    Router,
    ServiceUnavailable,
    endpoint,
)
from controller._service_ref import ServiceRef, write_table
from controller._service_types import HEALTHY, RECOVERING, ServiceConfig
from controller.testing import FakeService
from tests.integration.controller.service_actors import Echo


class Tagged(Actor):
    def __init__(self, tag: str):
        self.tag = tag

    @endpoint
    async def whoami(self) -> str:
        return self.tag

    @endpoint
    async def echo(self, x, delay: float = 0.0):
        await asyncio.sleep(delay)
        return x

    @endpoint
    async def slow(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return self.tag

    @endpoint
    async def fail(self, msg: str) -> None:
        raise ValueError(msg)


class Last(Router):
    """Always the healthy replica with the highest index; records what it was offered."""

    def __init__(self):
        self.offered: list[list[int]] = []

    def choose(self, replicas, sess_id):
        self.offered.append([r.index for r in replicas])
        return max(replicas, key=lambda r: r.index)


def fake(n: int = 3, **options) -> FakeService:
    return FakeService([Tagged("abcdefgh"[i]) for i in range(n)], **options)


async def test_round_robin_and_request_counts():
    svc = fake(3)
    assert [await svc.whoami.route() for _ in range(6)] == list("abcabc")
    assert all(m["requests_ok"] == 2 and m["state"] == "healthy" for m in svc.metrics().values())
    with pytest.raises(ActorError, match="boom"):
        await svc.fail.route("boom")
    assert svc.request_counts() == {
        "sent": 7,
        "retried": 0,
        "completed": 6,
        "failed": 1,
        "cancelled": 0,
    }
    m = svc.metrics()[0]  # the exception came from replica 0, which stays healthy
    assert (m["state"], m["requests_failed"], m["restarts"]) == ("healthy", 1, 0)


async def test_a_custom_router_decides_and_least_loaded_avoids_a_busy_replica():
    router = Last()
    svc = fake(3, router=router)
    assert {await svc.whoami.route() for _ in range(3)} == {"c"}
    assert router.offered[-1] == [0, 1, 2]

    svc = fake(2, router="least_loaded")
    busy = svc.slow.route(0.3).start()
    await asyncio.sleep(0.05)
    assert {await svc.whoami.route() for _ in range(4)} == {"b"}
    assert await busy == "a"


async def test_sessions_stick_are_rehomed_and_new_ones_go_to_the_least_loaded():
    svc = fake(3)
    async with svc.session():
        first = await svc.whoami.route()
        assert [await svc.whoami.route() for _ in range(5)] == [first] * 5
        svc.replicas["abc".index(first)].kill()
        second = await svc.whoami.route()
        assert second != first
        assert [await svc.whoami.route() for _ in range(5)] == [second] * 5
    sid = await svc.start_session()
    tag = await svc.whoami.route(sess_id=sid)
    assert [await svc.whoami.route(sess_id=sid) for _ in range(3)] == [tag] * 3
    await svc.terminate_session(sid)
    assert sum(m["sessions"] for m in svc.metrics().values()) == 0

    svc = fake(2)
    a = await svc.start_session()
    busy = svc.slow.route(0.3, sess_id=a).start()
    await asyncio.sleep(0.05)
    b = await svc.start_session()
    assert await svc.whoami.route(sess_id=b) != await busy
    assert sorted(m["sessions"] for m in svc.metrics().values()) == [1, 1]


async def test_a_request_whose_replica_dies_is_resent_elsewhere():
    svc = fake(3)
    svc.replicas[0].fail_next()
    assert await svc.whoami.route() in ("b", "c")  # round robin picked 0, which died
    assert svc.request_counts()["retried"] == 1
    m = svc.metrics()[0]
    assert (m["state"], m["restarts"], m["requests_failed"]) == ("healthy", 1, 1)
    assert "fail_next" in m["last_error"]


async def test_failover_is_bounded_by_max_retries_and_tries_each_replica_once():
    svc = fake(3, max_retries=1)
    for r in svc.replicas:
        r.fail_next()
    with pytest.raises(ActorDiedError):
        await svc.whoami.route()
    assert svc.request_counts()["retried"] == 1  # tried two replicas, gave up

    svc = fake(2, max_retries=5)
    for r in svc.replicas:
        r.fail_next(3)
    with pytest.raises(ActorDiedError):
        # a restarted replica is a new place to try: 6 deaths (max_retries + 1), alternating
        # between the two replicas, then the last death is raised
        await svc.whoami.route()
    assert svc.request_counts()["retried"] == 5
    assert [m["restarts"] for m in svc.metrics().values()] == [3, 3]


async def test_one_replica_service_retries_its_restarted_replica():
    svc = fake(1)
    svc.replicas[0].fail_next()  # dies on the request, restarted at once (a new generation)
    assert await svc.whoami.route() == "a"
    assert svc.request_counts() == {
        "sent": 1,
        "retried": 1,
        "completed": 1,
        "failed": 0,
        "cancelled": 0,
    }


async def test_a_request_waits_for_the_replica_restarted_after_its_host_died():
    svc = fake(1)
    call = asyncio.ensure_future(svc.echo.route("x", delay=0.5))
    await asyncio.sleep(0.1)
    svc.replicas[0].kill("its host died")
    await asyncio.sleep(0.3)  # the request waits (within unavailable_timeout) for a restart
    assert not call.done()
    svc.replicas[0].restart()
    assert await call == "x"
    counts = svc.request_counts()
    assert (counts["retried"], counts["completed"], counts["failed"]) == (1, 1, 0)


async def test_the_wait_for_a_restart_is_bounded_and_names_the_death():
    svc = fake(1, unavailable_timeout=0.4)
    call = svc.echo.route("x", delay=0.5).start()
    await asyncio.sleep(0.1)
    svc.replicas[0].kill("its host died")
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match="died on its replica.*its host died"):
        await call
    assert time.monotonic() - t0 < 2.0
    assert svc.request_counts()["failed"] == 1


async def test_a_poison_pill_kills_at_most_max_retries_plus_one_replicas():
    svc = fake(1, max_retries=2)
    svc.replicas[0].fail_next(10)  # every attempt dies; the replica restarts each time
    with pytest.raises(ActorDiedError):
        await svc.whoami.route()
    assert svc.request_counts()["retried"] == 2
    assert svc.metrics()[0]["restarts"] == 3


async def test_requests_in_flight_on_a_killed_replica_fail_over():
    svc = fake(3)
    calls = [svc.echo.route(i, delay=0.1).start() for i in range(60)]
    await asyncio.sleep(0.05)
    svc.replicas[1].kill()
    assert await asyncio.gather(*calls) == list(range(60))
    assert svc.request_counts()["retried"] >= 1
    assert svc.metrics()[1]["state"] == "unhealthy"
    assert sum(m["requests_ok"] for m in svc.metrics().values()) == 60


async def test_fanout_skips_a_replica_killed_mid_call():
    svc = fake(3)
    assert sorted(await svc.echo.fanout(7)) == [7, 7, 7]
    calls = [svc.echo.fanout_by_replica(i, delay=0.2).start() for i in range(5)]
    await asyncio.sleep(0.05)
    svc.replicas[2].kill()
    for i, got in enumerate(await asyncio.gather(*calls)):
        assert got == {0: i, 1: i}
    with pytest.raises(ActorError, match="boom"):
        await svc.fail.fanout("boom")
    running = svc.slow.fanout(5.0).start()
    await asyncio.sleep(0.05)
    svc.replicas[0].kill()
    svc.replicas[1].kill()
    with pytest.raises(ServiceUnavailable, match="every replica died during fanout"):
        await running


async def test_no_healthy_replica_waits_then_raises_and_a_restart_ends_the_wait():
    svc = fake(1, unavailable_timeout=0.3, health_poll_rate=0.02)
    svc.replicas[0].kill("refusing to start")
    t0 = time.monotonic()
    with pytest.raises(
        ServiceUnavailable, match=r"'Tagged' has no healthy replica after waiting 0.3 s.*0=unh"
    ):
        await svc.whoami.route()
    assert 0.25 <= time.monotonic() - t0 < 3
    waiting = svc.whoami.route().start()
    await asyncio.sleep(0.05)
    svc.replicas[0].restart()
    assert await waiting == "a"
    assert svc.metrics()[0]["restarts"] == 1


async def test_the_concurrency_cap_queues_requests_per_replica():
    svc = fake(1, replica_max_concurrent_requests=1)
    t0 = time.monotonic()
    calls = [svc.slow.route(0.1).start() for _ in range(3)]
    await asyncio.sleep(0.02)
    assert svc.metrics()[0]["in_flight"] == 3
    await asyncio.gather(*calls)
    assert time.monotonic() - t0 >= 0.29
    free = fake(1)
    t0 = time.monotonic()
    await asyncio.gather(*(free.slow.route(0.1) for _ in range(3)))
    assert time.monotonic() - t0 < 0.25


async def test_actor_adverbs_on_a_service_say_route_or_fanout_and_shutdown_ends_it():
    svc = fake(1)
    for adverb in ("call", "call_one", "choose", "broadcast", "stream"):
        with pytest.raises(TypeError, match=r"use `await svc.whoami.route\(...\)`.*fanout"):
            getattr(svc.whoami, adverb)()
    with pytest.raises(TypeError, match="route"):
        svc.whoami()
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        _ = svc.nope
    await svc.shutdown()
    assert all(m["state"] == "stopped" for m in svc.metrics().values())
    with pytest.raises(ServiceUnavailable, match="shut down"):
        await svc.whoami.route()


def test_options_are_checked_before_anything_starts():
    with pytest.raises(ValueError, match="unknown service option.*max_retry"):
        Echo.options(num_replicas=2, max_retry=1).as_service()
    with pytest.raises(ValueError, match="unknown router type: 'fastest'"):
        Echo.options(router="fastest").as_service()
    with pytest.raises(ValueError, match="replica_max_concurrent_requests"):
        Echo.options(replica_max_concurrent_requests=0).as_service()
    with pytest.raises(ValueError, match="health_check_timeout_s"):
        Echo.options(health_check_timeout_s=-1).as_service()
    with pytest.raises(ValueError, match="health_check_interval_s"):
        Echo.options(health_check_interval_s="5").as_service()
    with pytest.raises(ValueError, match="unknown router type"):
        fake(2, router="fastest")
    with pytest.raises(ValueError, match="no health checks"):
        fake(2, health_check_interval_s=1.0)


def test_process_variables_are_env_vars_and_env_is_refused():
    """``env`` means an RL environment in Forge; process variables are ``env_vars``, and the
    old keyword is a TypeError naming the new one, not a silent alias or a service option."""
    assert Echo.options(env_vars={"A": "1"})._options().env_vars == {"A": "1"}
    with pytest.raises(TypeError, match=r"options\(env=\.\.\.\).*env_vars="):
        Echo.options(num_replicas=2, env={"A": "1"})


def test_separate_options_calls_give_independent_configs():
    a = Echo.options(num_replicas=2, max_retries=0, router="least_loaded")
    b = Echo.options(num_replicas=1, replica_max_concurrent_requests=3)
    ca, cb = ServiceConfig.from_options(a._options()), ServiceConfig.from_options(b._options())
    assert (ca.num_replicas, ca.max_retries, ca.replica_max_concurrent_requests) == (2, 0, 10)
    assert (cb.num_replicas, cb.replica_max_concurrent_requests, cb.router) == (1, 3, "round_robin")


# -- a ServiceRef (a pickled service) routes through the same core ------------------------
def ref_over(tmp_path, svc: FakeService, **config) -> ServiceRef:
    """A ``ServiceRef`` reading a replica table that lists ``svc``'s fake replicas."""
    path = str(tmp_path / "table.pkl")
    publish(path, svc)
    cfg = ServiceConfig(num_replicas=len(svc.replicas), **config)
    return ServiceRef(svc.name, Tagged, path, cfg)


def publish(path: str, svc: FakeService, states: dict[int, str] | None = None) -> None:
    rows = []
    for r in svc.replicas:
        state = (states or {}).get(r.index, HEALTHY)
        rows.append((r.index, r.gen, state, r.mesh if state == HEALTHY else None))
    write_table(path, False, rows)


async def test_a_service_ref_uses_the_configured_router(tmp_path):
    router = Last()
    ref = ref_over(tmp_path, fake(3), router=router)
    assert {await ref.whoami.route() for _ in range(4)} == {"c"}
    assert router.offered == [[0, 1, 2]] * 4
    assert sorted(await ref.whoami.fanout()) == ["a", "b", "c"]

    busy_ref = ref_over(tmp_path, fake(2), router="least_loaded")
    busy = busy_ref.slow.route(0.3).start()
    await asyncio.sleep(0.05)
    assert {await busy_ref.whoami.route() for _ in range(3)} == {"b"}
    assert await busy == "a"


async def test_a_service_ref_fails_over_and_learns_of_restarts_from_the_table(tmp_path):
    svc = fake(2)
    path = str(tmp_path / "table.pkl")
    publish(path, svc)
    ref = ServiceRef(svc.name, Tagged, path, ServiceConfig(num_replicas=2))
    # A copy of replica 0 dies under a request: re-sent to replica 1, and replica 0 (same
    # generation) stays out of the ref's rotation even though the table still lists it.
    ref.replicas[0].mesh.kill()
    assert await ref.whoami.route() == "b"
    assert await ref.whoami.route() == "b"
    assert ref.request_counts()["retried"] == 1
    # The controller restarts it (a new generation): the ref routes to it again.
    svc.replicas[0].gen += 1
    svc.replicas[0].mesh.revive()
    publish(path, svc, {1: RECOVERING})
    ref._refresh()
    assert [await ref.whoami.route() for _ in range(2)] == ["a", "a"]
    with pytest.raises(TypeError, match="sessions are not supported through a pickled"):
        ref.whoami.route(sess_id="s")
    with pytest.raises(TypeError, match="sessions are not supported"):
        ref.start_session()
