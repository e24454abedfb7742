"""Actor metrics off the critical path: each step's row merges what the previous step's
flush returned (busy fractions, the replay buffer's metrics) while a new flush runs.

    flush = ActorMetrics(log, trainer, generator, buffer)
    row = {..., **await flush.step_fields()}   # each step
    await flush.finish(version)                # after the last step: its own row
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from forge.observability.names import M

if TYPE_CHECKING:
    from forge.actors.generator import Generator
    from forge.actors.replay_buffer import ReplayBuffer
    from forge.actors.trainer import Trainer

__all__ = ["ActorMetrics"]


class ActorMetrics:
    """Flushes the metric states of the trainer, the generator replicas and the replay
    buffer into a ``MetricLog`` one step late, so no step waits for them."""

    def __init__(self, log, trainer: Trainer, generator: Generator, buffer: ReplayBuffer) -> None:
        self.log, self.trainer, self.generator, self.buffer = log, trainer, generator, buffer
        self._pending: asyncio.Future | None = None

    async def step_fields(self) -> dict[str, float]:
        """Merge the last flush into the log and start the next; returns the buffer's
        running totals for the step's row."""
        if self._pending is not None:
            fields = await self._merge()
        else:  # the run's first step: no flush yet, ask the buffer once
            fields = _buffer_fields(await self.buffer.metrics.call_one())
        self._pending = asyncio.ensure_future(self._fetch())
        return fields

    async def finish(self, step: int) -> None:
        """The last flush, recorded as an extra row for ``step``."""
        if self._pending is not None:
            self.log.record_remote(step, await self._merge())

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()

    async def _merge(self) -> dict[str, float]:
        pending, self._pending = self._pending, None
        assert pending is not None  # callers check _pending first
        states, buffer_m = await pending
        self.log.merge(states)
        return _buffer_fields(buffer_m)

    async def _fetch(self) -> tuple[list[dict], dict]:
        parts = await asyncio.gather(
            self.trainer.flush_metrics.call(),
            self.generator.flush_metrics.fanout(),
            self.buffer.flush_metrics.call_one(),
            self.buffer.metrics.call_one(),
        )
        return [*parts[0].values(), *parts[1], parts[2]], parts[3]


def _buffer_fields(buffer_m: dict) -> dict[str, float]:
    """The replay buffer's running totals as the step row logs them."""
    return {
        M.POLICY_AGE_MEAN: buffer_m[M.SAMPLED_POLICY_AGE_MEAN],
        M.EVICTED_STALE_TOTAL: buffer_m[M.EVICTED_STALE],
    }
