"""An actor's own service options (``Actor.service_defaults``): ``as_service`` applies them,
``options(...)`` overrides them, and they are checked like the caller's."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.controller.service_actors import Batcher


async def test_an_actor_picks_its_cap_and_the_caller_overrides_it():
    svc = await Batcher.as_service(24)
    try:
        assert svc.config.replica_max_concurrent_requests == 24
        # All 24 calls reach the replica at once (the services' default cap is 10).
        await asyncio.gather(*(svc.hold.route(2.0) for _ in range(24)))
        assert await svc.peak_in_flight.route() == 24
    finally:
        await svc.shutdown()
    svc = await Batcher.options(replica_max_concurrent_requests=4).as_service(24)
    try:
        assert svc.config.replica_max_concurrent_requests == 4
        await asyncio.gather(*(svc.hold.route(0.3) for _ in range(12)))
        assert await svc.peak_in_flight.route() == 4
    finally:
        await svc.shutdown()


def test_an_actors_bad_choice_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="replica_max_concurrent_requests"):
        Batcher.as_service(0)
