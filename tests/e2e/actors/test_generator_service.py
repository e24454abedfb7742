"""Generators as a service: a replica killed after a weight push comes back serving the
latest pushed version (never stale or initial weights)."""

from __future__ import annotations

import os
import signal
import uuid

import torch

from controller import session_tag
from forge.actors.generator import Generator
from forge.generation.backend import GeneratorConfig, state_dict_checksum
from forge.models import load_model
from forge.weights import SharedMemoryTransport, WeightStore, WeightTransportConfig
from tests.helpers import replica_restarted


async def test_killed_replica_recovers_with_the_latest_version(tiny_model_dir):
    prefix = f"{session_tag()}-gen-svc-{uuid.uuid4().hex[:6]}"
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    cfg = GeneratorConfig(model=tiny_model_dir, weights=WeightTransportConfig(prefix=prefix))
    try:
        svc = await Generator.options(num_replicas=2).as_service(cfg)
        model = load_model(tiny_model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        pushed = model.state_dict()
        handle = store.push(pushed, 1)
        assert await svc.update_weights.fanout(1, handle) == [1, 1]

        victim = svc.metrics()[0]["pids"][0]
        os.kill(victim, signal.SIGKILL)
        # requests keep being served by the healthy replica meanwhile
        (c,) = await svc.generate.route("12 ", n=1, max_tokens=3)
        assert c.generator_version == 1
        await replica_restarted(svc, victim)
        assert await svc.get_version.fanout() == [1, 1]
        want = state_dict_checksum(pushed)
        assert await svc.state_dict_checksum.fanout() == [want, want]
    finally:
        store.close()
