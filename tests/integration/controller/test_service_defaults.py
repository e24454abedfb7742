"""An actor's own service options (``Actor.service_defaults``): ``as_service`` applies them,
``options(...)`` overrides them, and they are checked like the caller's."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.controller.service_actors import Batcher


async def _peak(batcher, calls: int, seconds: float) -> tuple[int, int]:
    """The service's cap, and the most calls its replica held at once out of ``calls``."""
    svc = await batcher.as_service(24)
    try:
        await asyncio.gather(*(svc.hold.route(seconds) for _ in range(calls)))
        return svc.config.replica_max_concurrent_requests, await svc.peak_in_flight.route()
    finally:
        await svc.shutdown()


async def test_an_actor_picks_its_cap_and_the_caller_overrides_it():
    # All 24 calls reach the replica at once (the services' default cap is 10) ...
    assert await _peak(Batcher, 24, 2.0) == (24, 24)
    # ... unless the caller says otherwise.
    assert await _peak(Batcher.options(replica_max_concurrent_requests=4), 12, 0.3) == (4, 4)


def test_an_actors_bad_choice_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="replica_max_concurrent_requests"):
        Batcher.as_service(0)
