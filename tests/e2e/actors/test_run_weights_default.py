"""With no weights prefix configured anywhere, a Trainer's pushes and the pulls of a restarted
Generator or ReferenceModel replica meet at the run's publication location: the restarted
replica serves the latest version before it takes traffic."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from forge.actors.generator import Generator
from forge.actors.reference_model import ReferenceModel
from forge.actors.trainer import Trainer
from forge.generation.backend import GeneratorConfig
from forge.training import OptimizerConfig, ReferenceConfig, TrainerConfig
from forge.weights import WeightTransportConfig, build_transport
from tests.episodes import make_batch
from tests.helpers import wait_dead


async def _restarted(svc, victim: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        m = svc.metrics()[0]
        if m["state"] == "healthy" and m["pids"] and m["pids"][0] != victim:
            return
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.05)


@pytest.mark.timeout(300)
async def test_restarted_replicas_load_the_latest_version_with_no_wiring(tiny_model_dir):
    cfg = TrainerConfig(model=tiny_model_dir, optimizer=OptimizerConfig(lr=1e-2))
    assert cfg.weights == GeneratorConfig(model=tiny_model_dir).weights == WeightTransportConfig()
    assert cfg.weights.prefix == ""  # shm at the run's publication location
    ref_cfg = ReferenceConfig(model=tiny_model_dir, update={"type": "reset", "every": 2})
    trainer, gen, ref = await asyncio.gather(
        Trainer.as_actor(cfg),
        Generator.options(num_replicas=2, health_poll_rate=0.05).as_service(
            GeneratorConfig(model=tiny_model_dir)
        ),
        ReferenceModel.options(num_replicas=1, health_poll_rate=0.05).as_service(ref_cfg),
    )
    batch = make_batch(tiny_model_dir)
    for version in (1, 2, 3):
        await trainer.train_step.call_one(batch)
        await trainer.push_weights.call_one(version)  # handles unused: pulls go by location
    # keep_last=2 versions are there, at the run's location
    assert build_transport(WeightTransportConfig()).versions() == [2, 3]
    assert await gen.get_version.fanout() == [0, 0]  # the app sent no update

    victims = gen.metrics()[0]["pids"][0], ref.metrics()[0]["pids"][0]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    assert wait_dead(list(victims), 10) == []
    await _restarted(gen, victims[0])
    await _restarted(ref, victims[1])
    by_replica = await gen.get_version.fanout_by_replica()
    assert by_replica == {0: 3, 1: 0}  # only the restarted one pulled (no wiring in "app")
    assert await ref.version.route() == 2  # reset rule, every 2: the newest reset point

    # A version pushed after the restart (which no update reached) is loaded before the
    # restarted replica's first completions; the healthy peer still serves 0.
    await trainer.train_step.call_one(batch)
    await trainer.push_weights.call_one(4)
    stamps = set()
    for _ in range(4):
        [c] = await gen.generate.route("12 ", n=1, max_tokens=2)
        stamps.add(c.generator_version)
    assert stamps == {0, 4}
    # The app's late update to an older version is a no-op there, a move elsewhere.
    assert await gen.update_weights.fanout_by_replica(3) == {0: 4, 1: 3}
    assert gen.metrics()[0]["last_recovery_s"] > 0
    await trainer.close.call_one()
