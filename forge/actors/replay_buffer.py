"""ReplayBuffer: the single actor that holds scored episodes between rollouts and training.

Endpoints (all called with ``call_one`` on a one-rank mesh):

- ``add(episodes)``: rollout tasks add one ``Episode`` or a list.
- ``sample(curr_policy_version)``: the training loop asks for ``dp_size`` batches of
  ``batch_size`` episodes (collated into ``TrainBatch``es unless ``collate=False``), or gets
  ``None`` while there are not enough usable episodes. Episodes older than
  ``max_policy_age`` versions are evicted first.
- ``take(curr_policy_version, max_n, min_n)``: trajectory streaming, the oldest usable
  episodes as one batch (consumed), or ``None`` while fewer than ``min_n`` are held.
- ``evict(curr_policy_version)``, ``clear()``, ``length()``.
- ``state_dict()`` / ``load_state_dict(state)``: for checkpoints.
- ``metrics()``: evicted-as-stale and dropped counts, sampled policy ages.

The logic lives in ``forge.replay.ReplayBufferCore``; this file only puts it behind endpoints
and records metrics.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from controller import endpoint
from forge.actors.forge_actor import ForgeActor
from forge.observability import Reduce, record_metric
from forge.replay import ReplayBufferCore, collate_episodes
from forge.types import Episode


@dataclass
class ReplayBufferConfig:
    """Replay-buffer settings; see ``ReplayBufferCore`` for their meaning."""

    batch_size: int = 8
    dp_size: int = 1
    max_policy_age: int = 1
    max_resample_count: int = 0
    max_buffer_size: int | None = None
    seed: int = 0
    sample_policy: str = "uniform"
    eviction_policy: str = "fifo"
    collate: bool = True
    pad_id: int = 0


class ReplayBuffer(ForgeActor):
    """Holds episodes; see the module docstring for its endpoints."""

    def __init__(self, config: ReplayBufferConfig | None = None, collate: Any = None):
        self.config = config or ReplayBufferConfig()
        c = self.config
        if collate is None and c.collate:
            collate = functools.partial(collate_episodes, pad_id=c.pad_id)
        self.core = ReplayBufferCore(
            batch_size=c.batch_size,
            dp_size=c.dp_size,
            max_policy_age=c.max_policy_age,
            max_resample_count=c.max_resample_count,
            max_buffer_size=c.max_buffer_size,
            seed=c.seed,
            sample_policy=c.sample_policy,
            eviction_policy=c.eviction_policy,
            collate=collate,
        )

    @endpoint
    async def add(self, episodes: Episode | list[Episode]) -> int:
        """Add episodes; returns the number held afterwards."""
        self.core.add(episodes)
        self._added().set()  # wakes sample/take calls waiting for episodes
        return len(self.core)

    def _added(self) -> asyncio.Event:
        if getattr(self, "_added_event", None) is None:
            self._added_event = asyncio.Event()
        return self._added_event

    async def _until(self, attempt, wait_s: float):
        """``attempt()``, retried after each ``add`` until it is not ``None`` or ``wait_s``
        seconds passed (a waiting caller gets its batch the moment it is complete, with no
        polling round trips)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            self._added().clear()
            out = attempt()
            left = deadline - loop.time()
            if out is not None or left <= 0:
                return out
            try:
                await asyncio.wait_for(self._added().wait(), left)
            except TimeoutError:
                return attempt()

    @endpoint
    async def sample(self, curr_policy_version: int, wait_s: float = 0.0) -> list[Any] | None:
        """``dp_size`` batches for ``curr_policy_version``, or ``None`` if not enough (after
        waiting up to ``wait_s`` seconds for episodes to arrive)."""
        stale_before = self.core.metrics()["replay/evicted_stale"]
        batches = await self._until(lambda: self.core.sample(curr_policy_version), wait_s)
        m = self.core.metrics()
        record_metric("replay/evicted_stale", m["replay/evicted_stale"] - stale_before, Reduce.SUM)
        if batches is not None:
            record_metric("replay/sampled_policy_age_mean", m["replay/sampled_policy_age_mean"])
            record_metric(
                "replay/sampled_policy_age_max", m["replay/sampled_policy_age_max"], Reduce.MAX
            )
        record_metric("replay/size", len(self.core))
        return batches

    @endpoint
    async def take(
        self, curr_policy_version: int, max_n: int, min_n: int = 1, wait_s: float = 0.0
    ) -> Any | None:
        """Trajectory streaming: up to ``max_n`` of the oldest usable episodes as one batch,
        or ``None`` while fewer than ``min_n`` are held after waiting up to ``wait_s`` seconds
        (see ``ReplayBufferCore.take``)."""
        part = await self._until(lambda: self.core.take(curr_policy_version, max_n, min_n), wait_s)
        if part is not None:
            m = self.core.metrics()
            record_metric("replay/sampled_policy_age_mean", m["replay/sampled_policy_age_mean"])
            record_metric(
                "replay/sampled_policy_age_max", m["replay/sampled_policy_age_max"], Reduce.MAX
            )
        record_metric("replay/size", len(self.core))
        return part

    @endpoint
    async def evict(self, curr_policy_version: int) -> int:
        return self.core.evict(curr_policy_version)

    @endpoint
    async def clear(self) -> None:
        self.core.clear()

    @endpoint
    async def length(self) -> int:
        return len(self.core)

    @endpoint
    async def metrics(self) -> dict[str, float]:
        return self.core.metrics()

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict()

    @endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self.core.load_state_dict(state)
