"""Issue 35: generator replicas (a service) put to sleep for colocation: one replica killed
while asleep is restarted by the service, comes back awake, and after the next weight push
and ``wake`` every replica serves the pushed version; sleep and wake report memory."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
import torch

from controller import session_tag
from forge.actors.generator import Generator
from forge.generation.backend import GeneratorConfig, state_dict_checksum
from forge.models import load_model
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig
from tests.helpers import replica_restarted


@pytest.mark.slow
async def test_a_replica_killed_while_asleep_heals_and_serves_the_next_version(tiny_model_dir):
    prefix = f"{session_tag()}-gen-sleep-{uuid.uuid4().hex[:6]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    cfg = GeneratorConfig(model=tiny_model_dir, weights=WeightTransportConfig(prefix=prefix))
    try:
        svc = await Generator.options(num_replicas=2).as_service(cfg)
        await svc.generate.fanout("12 ", n=2, max_tokens=3)
        snaps = await svc.sleep.fanout(2)
        assert len(snaps) == 2 and all(s["rss_mb"] > 0 for s in snaps)
        assert [s["asleep"] for s in await svc.stats.fanout()] == [True, True]

        victim = svc.metrics()[0]["pids"][0]
        os.kill(victim, signal.SIGKILL)
        await replica_restarted(svc, victim)
        # The restarted replica comes up awake; the other still sleeps.
        assert sorted(s["asleep"] for s in await svc.stats.fanout()) == [False, True]

        model = load_model(tiny_model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        handle = store.push(model.state_dict(), 1)
        assert await svc.update_weights.fanout(1, handle) == [1, 1]  # asleep: loads anyway
        await svc.wake.fanout()  # the awake one: a no-op
        assert [s["asleep"] for s in await svc.stats.fanout()] == [False, False]
        want = state_dict_checksum(model.state_dict())
        assert await svc.state_dict_checksum.fanout() == [want, want]
        for completions in await svc.generate.fanout("12 ", n=2, max_tokens=3):
            assert {c.generator_version for c in completions} == {1}
    finally:
        store.close()
