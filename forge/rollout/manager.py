"""RolloutManager: concurrent rollout loops with bounded asynchrony, over-sampling and
group filters (DAPO's dynamic sampling), feeding the replay buffer.

    manager = RolloutManager(produce, consume, groups_per_step=16, max_policy_age=1,
                             concurrency=16, filter_fn=nonzero_variance,
                             over_sampling_factor=2.0)
    manager.start()
    for step in ...:
        batch = await next_batch(...)             # manager.check() surfaces loop crashes
        ... train, push weights ...
        manager.advance(version)                  # a new policy version is being served
    await manager.stop()

``produce()`` makes one scored group (a list of ``Episode``, e.g. a prompt's G completions,
or G trajectories of one task); ``consume(group)`` stores it (``buffer.add``).

* **Bounded asynchrony**: one credit per group; ``groups_per_step * (max_policy_age + 1)``
  credits, handed back ``groups_per_step`` at a time by ``advance``. Rollouts therefore run
  at most ``max_policy_age`` versions ahead of the trainer (0 = on-policy).
* **Over-sampling and filters**: a group that ``filter_fn`` rejects gives its credit back
  (another prompt is tried) while the step's attempts stay within
  ``over_sampling_factor * groups_per_step``; past that budget groups are kept whatever the
  filter says, so a policy that always fails (or always succeeds) still trains. Filtered and
  kept-over-budget groups are counted.
* **Credits are never lost**: a group already older than ``max_policy_age`` when it is
  done (a generator replica restarted on older weights made it) gives its credit back
  instead of going to the buffer, which would evict it; and ``unstick`` (called by the
  trainer's wait for a batch) hands out a step's credits when every loop waits for one while
  the trainer waits for data, so credits spent on groups the buffer evicted later cannot
  stall the run.
* **Partial rollouts**: a group still being generated when the weights move on (``advance``)
  finishes on the weights it started with and is kept for a later step, stamped with its
  versions; the replay buffer's policy-age limit bounds how old it may be. With
  ``partial=False`` such groups are dropped instead (and counted).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

from forge.types import Episode

__all__ = ["RolloutManager"]

Group = list[Episode]


class RolloutManager:
    """See the module docstring."""

    def __init__(
        self,
        produce: Callable[[], Awaitable[Group | None]],
        consume: Callable[[Group], Awaitable[Any]],
        *,
        groups_per_step: int,
        max_policy_age: int = 0,
        concurrency: int = 4,
        filter_fn: Callable[[Group], bool] | None = None,
        over_sampling_factor: float = 1.0,
        partial: bool = True,
        record: Callable[[str, list[float]], None] | None = None,
    ) -> None:
        if groups_per_step < 1 or concurrency < 1 or max_policy_age < 0:
            raise ValueError(
                f"RolloutManager needs groups_per_step >= 1, concurrency >= 1 and "
                f"max_policy_age >= 0; got {groups_per_step}, {concurrency}, {max_policy_age}"
            )
        if over_sampling_factor < 1.0:
            raise ValueError(f"over_sampling_factor must be >= 1, got {over_sampling_factor}")
        self.produce, self.consume = produce, consume
        self.groups_per_step = groups_per_step
        self.concurrency = concurrency
        self.filter_fn = filter_fn
        self.partial = partial
        self.budget = math.ceil(over_sampling_factor * groups_per_step)
        self.record = record or (lambda key, values: None)
        self.version = 0
        self.max_policy_age = max_policy_age
        self._credits = asyncio.Semaphore(groups_per_step * (max_policy_age + 1))
        self._waiting = 0  # loops waiting for a credit
        self._attempts = 0  # groups finished since the last advance
        self._tasks: list[asyncio.Task] = []
        self._failure: tuple[str, BaseException] | None = None
        self.counts = dict.fromkeys(
            (
                "produced",
                "kept",
                "filtered",
                "kept_over_budget",
                "carried_over",
                "dropped",
                "stale",
                "refilled",
            ),
            0,
        )

    def reconfigure(
        self,
        *,
        filter_fn: Callable[[Group], bool] | None,
        over_sampling_factor: float,
        partial: bool,
    ) -> None:
        """Change the group filter, over-sampling budget and partial-rollout rule while the
        loops run (a phase switch); takes effect from the next group."""
        if over_sampling_factor < 1.0:
            raise ValueError(f"over_sampling_factor must be >= 1, got {over_sampling_factor}")
        self.filter_fn = filter_fn
        self.partial = partial
        self.budget = math.ceil(over_sampling_factor * self.groups_per_step)

    def start(self) -> None:
        """Start ``concurrency`` rollout loops on the running event loop."""
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.concurrency)]

    def advance(self, version: int) -> None:
        """The trainer published ``version`` (and generators serve it): a step's worth of
        credits comes back and the over-sampling budget starts afresh."""
        self.version = version
        self._attempts = 0
        for _ in range(self.groups_per_step):
            self._credits.release()

    def check(self) -> None:
        """Raise if a rollout loop died, or ``fail`` was called (with the error as the cause)."""
        if self._failure is not None:
            what, error = self._failure
            raise RuntimeError(what) from error
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise RuntimeError("a rollout loop failed") from t.exception()

    def fail(self, error: BaseException, what: str = "the rollouts' weights failed") -> None:
        """Something the rollouts wait on failed (e.g. loading a version on the generators,
        which would otherwise leave the trainer waiting for a batch that never comes): the
        next ``check`` raises ``what`` with ``error`` as its cause."""
        if self._failure is None:
            self._failure = (what, error)

    async def stop(self) -> None:
        """Cancel the loops and wait for them."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def unstick(self) -> bool:
        """Called while the trainer waits for a batch: if every loop waits for a credit (none
        is generating) the credits were spent on groups the batch cannot use (the replay
        buffer evicted them as too old), so a step's worth is handed out at the current
        version, counted (``refilled``) and recorded. Returns whether it did. Safe for the
        age bound: nothing is in flight, so the new groups are on-policy."""
        if not self._tasks or self._waiting < len(self._tasks) or not self._credits.locked():
            return False
        self.counts["refilled"] += 1
        self.record("rollout/credit_refills", [1.0])
        for _ in range(self.groups_per_step):
            self._credits.release()
        return True

    async def _loop(self) -> None:
        while True:
            self._waiting += 1
            try:
                await self._credits.acquire()
            finally:
                self._waiting -= 1
            started = self.version
            group = await self.produce()
            if not group:  # the producer gave up on this one (e.g. it was counted as lost)
                self._credits.release()
                continue
            self.counts["produced"] += 1
            if self.version - min(e.policy_version for e in group) > self.max_policy_age:
                # born too old for any batch (e.g. a replica restarted on old weights): the
                # buffer would evict it and the credit would be lost for good
                self.counts["stale"] += 1
                self.record("rollout/stale_groups", [1.0])
                self._credits.release()
                continue
            if self.version != started:
                self.counts["carried_over"] += 1
                self.record("rollout/carried_over_groups", [1.0])
                if not self.partial:
                    self.counts["dropped"] += 1
                    self._credits.release()
                    continue
            if not self._keep(group):
                self._credits.release()
                continue
            self.counts["kept"] += 1
            await self.consume(group)

    def _keep(self, group: Group) -> bool:
        self._attempts += 1
        if self.filter_fn is None or self.filter_fn(group):
            self.record("rollout/filtered_groups", [0.0])
            return True
        if self._attempts <= self.budget:
            self.counts["filtered"] += 1
            self.record("rollout/filtered_groups", [1.0])
            return False
        self.counts["kept_over_budget"] += 1
        self.record("rollout/kept_over_budget_groups", [1.0])
        return True
