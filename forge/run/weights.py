"""Weight sync of a run: the trainer publishes version ``v``, every generator replica (and a
reference model that follows the policy) loads it, then the rollout manager hands out the
next step's credits so new rollouts run on it.

    sync = WeightSync(trainer, generator, reference, log=log, on_served=manager.advance,
                      on_failed=manager.fail, overlap=cfg.max_policy_age > 0)
    await sync.push(version)     # after each training step
    ...
    await sync.wait()            # before an evaluation, and at the end

With ``overlap`` (rollouts may be a version old) the replicas load the weights beside the
trainer's next step: its next batch is (mostly) already in the buffer. The previous load is
always finished before the next push, which may reuse its files. A load that fails in the
background is handed to ``on_failed`` at once (the rollout manager's ``fail``: the trainer's
wait for its next batch raises it), not only at the next push, which that batch would gate. Each push logs its size
(``weights/push_bytes``) and the trainer's time publishing it (``time/weight_push_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from controller import ActorDiedError

__all__ = ["PUSH_BYTES", "PUSH_S", "WeightSync"]

PUSH_BYTES = "weights/push_bytes"  # bytes the trainer published for the step's version
PUSH_S = "time/weight_push_s"  # seconds of the trainer's push_weights call
logger = logging.getLogger("forge.weights")


class WeightSync:
    """Pushes the trainer's weights and loads them on the generators (see the module)."""

    def __init__(
        self,
        trainer,
        generator,
        reference=None,
        *,
        teacher=None,
        log=None,
        on_served: Callable[[int], Any] | None = None,
        on_failed: Callable[[BaseException, str], Any] | None = None,
        overlap: bool = True,
    ) -> None:
        self.trainer, self.generator, self.reference = trainer, generator, reference
        self.teacher = teacher  # an OPD teacher that follows the policy (teacher.update)
        self.log, self.on_served, self.overlap = log, on_served, overlap
        self.on_failed = on_failed
        self._pending: asyncio.Future | None = None

    async def push(self, version: int) -> None:
        """Publish ``version`` from the trainer and start loading it on the replicas
        (awaited here unless ``overlap``)."""
        await self.wait()  # the last version's pull ends before the next push reuses it
        t0 = time.perf_counter()
        handle = (await self.trainer.push_weights.call(version)).item(procs=0)
        if self.log is not None:  # (a LoRA policy pushes only its adapter: a few KB to MBs)
            self.log.add(PUSH_BYTES, [float(handle.nbytes)])
            self.log.add(PUSH_S, [time.perf_counter() - t0])
        self._pending = asyncio.ensure_future(self._load(version, handle))
        self._pending.add_done_callback(lambda f, v=version: self._report(f, v))
        if not self.overlap:
            await self.wait()

    async def _broadcast(self, version: int, handle) -> dict[int, int]:
        """``weights: {type: broadcast}``: the trainer sends ``version`` to every healthy
        replica in one group, re-formed when they change (a restart). A replica that dies
        meanwhile is skipped, as in a fanout, and the others get it in a new group; any other
        failure is tried once more in a new group. ``{replica index: version}``."""
        error: BaseException | None = None
        gone: set[int] = set()  # ids of meshes whose process died during a send
        served: dict[int, int] = {}  # replicas that have it (a failed send may reach some)
        for attempt in range(3):
            targets = [
                r
                for r in self.generator.replicas
                if r.state == "healthy" and id(r.mesh) not in gone and r.index not in served
            ]
            if not targets:
                if served:
                    return served
                raise RuntimeError("no healthy generator replica to send the weights to")
            members = tuple(tuple(r.mesh.pids) for r in targets)  # a restart: a new group
            spec = (await self.trainer.weight_group.call(members, attempt > 0)).item(procs=0)
            addressed = dataclasses.replace(handle, location=spec.url())
            t0 = time.perf_counter()
            results = await self._send_round(version, spec, targets, addressed)
            died = [r for r, x in zip(targets, results[1:]) if isinstance(x, ActorDiedError)]
            gone.update(id(r.mesh) for r in died)
            served.update(
                (r.index, x)
                for r, x in zip(targets, results[1:])
                if not isinstance(x, BaseException)
            )
            failed = [x for x in results if isinstance(x, BaseException)]
            if not failed:
                return served
            error = failed[0]
            outcome = ", ".join(
                f"replica {r.index}: {_outcome(x)}" for r, x in zip(targets, results[1:])
            )
            logger.warning(
                "weight broadcast of version %d to %d replicas failed after %.1f s "
                "(%s: %s); %s; trying again in a new group",
                version,
                len(targets),
                time.perf_counter() - t0,
                type(error).__name__,
                error,
                outcome,
            )
            if not died and attempt > 0:
                break
        raise RuntimeError(f"weight version {version} could not be broadcast") from error

    async def _send_round(self, version: int, spec, targets, addressed) -> list:
        """One broadcast in group ``spec``: the trainer's send and each target's receive, with
        their results (or exceptions) in that order. The first call that fails aborts the
        group, so the other members stop waiting in it at once instead of at gloo's timeout."""
        aborted = False

        async def aborting(call):
            nonlocal aborted
            try:
                return await call
            except BaseException:
                if not aborted:
                    aborted = True
                    with contextlib.suppress(Exception):
                        await self.trainer.abort_weight_group.call(spec.id, timeout=30)
                raise

        return await asyncio.gather(
            aborting(self.trainer.send_weights.call(version, spec)),
            *(aborting(r.mesh.update_weights.call_one(version, addressed)) for r in targets),
            return_exceptions=True,
        )

    async def resume(self, version: int) -> None:
        """A resumed run: the replicas start on the restored trainer's ``version``."""
        handle = (await self.trainer.push_weights.call(version)).item(procs=0)
        if handle is not None and handle.transport == "broadcast":
            await self._broadcast(version, handle)
        else:
            await self.generator.update_weights.fanout(version, handle)

    async def wait(self) -> None:
        """The load in flight (if any) is done."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await pending

    def cancel(self) -> None:
        """Drop the load in flight (the run is failing)."""
        if self._pending is not None:
            self._pending.cancel()

    def _report(self, done: asyncio.Future, version: int) -> None:
        error = None if done.cancelled() else done.exception()
        if self.on_failed is not None and error is not None:
            self.on_failed(error, f"loading weight version {version} on the generators failed")

    async def _load(self, version: int, handle) -> None:
        if handle.transport == "broadcast":
            served = await self._broadcast(version, handle)
        else:
            served = await self.generator.update_weights.fanout_by_replica(version, handle)
        if self.log is not None:
            self.log.status.served(served)
        for follower in (self.reference, self.teacher):  # a moving reference or teacher
            if follower is not None:  # (EMA / reset) pulls it too; frozen ones ignore it
                await follower.update_weights.fanout(version, handle)
        if self.on_served is not None:
            self.on_served(version)


def _outcome(result) -> str:
    if isinstance(result, ActorDiedError):
        return "died"
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {str(result)[:200]}"
    return f"has version {result}"
