"""Time-sliced colocation (``placement.colocate``): the generator and trainer take turns on
one device, every step::

    colo = Colocation.of(cfg.placement, trainer, generator, log)   # None unless colocate
    await colo.start()           # before the first rollouts: the optimizer state to host
    # ... rollouts fill the step's batch (phase "generate") ...
    await colo.to_train()        # generator sleeps (KV cache, level 2: weights), state back
    # ... train_step (phase "train") ...
    await sync.push(version)     # the new weights, loaded by the sleeping generator
    await colo.to_generate()     # the optimizer state to host, the generator wakes

    generate ──▶ sleep generator ──▶ train ──▶ hand over weights ──▶ wake generator ──┐
       ▲                                                                              │
       └──────────────────────────────────────────────────────────────────────────────┘

The run is on-policy (``max_policy_age: 0``, checked at load), so no rollout needs the
generator while it sleeps; a call that arrives anyway (a replacement group) waits in the
replica's queue until ``wake``. A replica restarted while the others sleep comes up awake
(``wake`` is then a no-op for it). On CPU the same phases run: sleeping frees the KV cache
(and weights), and offloading moves nothing.

Memory at every phase end is logged for each process as ``memory/<role>/<phase>/<kind>_mb``
(``role``: generator, trainer; ``phase``: generate, asleep, train, awake; ``kind``: rss,
gpu_allocated, gpu_reserved, gpu_peak, the last the peak since the previous phase end), and
the phase times as ``time/colocate_<what>_s``.
"""

from __future__ import annotations

import time
from typing import Any

from forge.run.placement import PlacementConfig

__all__ = ["PHASES", "Colocation", "memory_metrics"]

PHASES = ("generate", "asleep", "train", "awake")


def memory_metrics(role: str, phase: str, snapshots: list[dict[str, float]]) -> dict[str, float]:
    """``memory/<role>/<phase>/<kind>_mb`` from processes' ``memory_snapshot()``s: the
    largest value over the processes (the one that decides whether the device fits)."""
    out: dict[str, float] = {}
    for snap in snapshots:
        for key, value in snap.items():
            name = f"memory/{role}/{phase}/{key}"
            out[name] = max(out.get(name, value), value)
    return out


class Colocation:
    """Drives the phases of one time-sliced run (see the module docstring)."""

    def __init__(self, placement: PlacementConfig, trainer, generator, log=None) -> None:
        if not placement.colocate:
            raise ValueError("Colocation needs placement.colocate: true")
        self.placement, self.trainer, self.generator, self.log = (
            placement,
            trainer,
            generator,
            log,
        )
        self.asleep = False
        self.cycles = 0

    @classmethod
    def of(cls, placement: PlacementConfig, trainer, generator, log=None) -> Colocation | None:
        """The run's colocation driver, or ``None`` when ``placement.colocate`` is off."""
        return cls(placement, trainer, generator, log) if placement.colocate else None

    async def start(self) -> None:
        """Before the first rollouts: the trainer's optimizer state goes to host memory."""
        await self._offload()

    async def to_train(self) -> None:
        """The step's batch is ready: put the generator to sleep, bring the optimizer back."""
        await self._snapshot("generate")
        t = time.perf_counter()
        await self.generator.sleep.fanout(self.placement.sleep_level)
        self.asleep = True
        if self.placement.offload_optimizer:
            moved = sum((await self.trainer.reload_optimizer.call()).values())
            self._add("colocate/optimizer_reloaded_bytes", float(moved))
        self._add("time/colocate_sleep_s", time.perf_counter() - t)
        await self._snapshot("asleep")

    async def to_generate(self) -> None:
        """The new weights are loaded: offload the optimizer state, wake the generator."""
        await self._snapshot("train")
        t = time.perf_counter()
        await self._offload()
        await self.generator.wake.fanout()
        self.asleep = False
        self.cycles += 1
        self._add("time/colocate_wake_s", time.perf_counter() - t)
        await self._snapshot("awake")

    async def _offload(self) -> None:
        if self.placement.offload_optimizer:
            moved = sum((await self.trainer.offload_optimizer.call()).values())
            self._add("colocate/optimizer_offloaded_bytes", float(moved))

    async def _snapshot(self, phase: str) -> None:
        gen = await self.generator.memory.fanout()
        trainer = (await self.trainer.memory.call()).values()
        for name, value in {
            **memory_metrics("generator", phase, gen),
            **memory_metrics("trainer", phase, trainer),
        }.items():
            self._add(name, value)

    def _add(self, key: str, value: Any) -> None:
        if self.log is not None:
            self.log.add(key, [float(value)])
