"""The training side's wait for data: a usable batch from the replay buffer, or the step's
episodes streamed to the trainer as they arrive, with a bound on every wait.

    m, waited_s = await train_next(buffer, trainer, version, manager, timeout_s=600,
                                   critic=critic)                    # one whole batch
    m, waited_s = await train_streamed(buffer, trainer, version, manager, episodes=128,
                                       chunk=32, timeout_s=600)      # trajectory streaming

A rollout loop that crashed surfaces here (``manager.check()``); rollouts whose credits all
went to groups too old to use get a step's worth more (``manager.unstick()``); no usable
batch within ``timeout_s`` (``batch_timeout_s``) raises ``TimeoutError`` naming the
buffer's state.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from forge.observability.names import M
from forge.run.gae_critic import train_step

logger = logging.getLogger("forge.rollout")

if TYPE_CHECKING:
    from forge.actors.replay_buffer import ReplayBuffer
    from forge.actors.trainer import Trainer

__all__ = ["next_batch", "train_batch", "train_next", "train_streamed"]


async def next_batch(buffer: ReplayBuffer, version: int, manager, timeout_s: float):
    """Wait for the buffer to hold a batch usable at ``version`` (the buffer answers as
    soon as it is complete, or after 0.5 s with ``None``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = await buffer.sample.call_one(version, wait_s=0.5)
        if batch is not None:
            return batch
        manager.check()
        _unstick(manager, version)
        if time.monotonic() > deadline:
            await _starved(buffer, version, manager, timeout_s)


async def train_next(
    buffer: ReplayBuffer,
    trainer: Trainer,
    version: int,
    manager,
    *,
    timeout_s: float,
    critic=None,
    before_train=None,
) -> tuple[dict, float]:
    """Wait for a batch, then one training step on it (with a ``forge.run.gae_critic.GAECritic``:
    PPO's values and critic update too). ``before_train``: awaited once the batch is there
    (time-sliced colocation puts the generator to sleep). Returns (metrics, seconds spent
    waiting)."""
    t = time.perf_counter()
    batch = await next_batch(buffer, version, manager, timeout_s)
    waited = time.perf_counter() - t
    if before_train is not None:
        await before_train()
    return await train_step(trainer, batch, critic), waited


async def train_streamed(
    buffer: ReplayBuffer,
    trainer: Trainer,
    version: int,
    manager,
    *,
    episodes: int,
    chunk: int,
    timeout_s: float,
) -> tuple[dict, float]:
    """Trajectory streaming: hand the trainer the step's ``episodes`` as they arrive, at
    least ``chunk`` at a time, then step once. Returns (metrics, seconds spent waiting)."""
    got, waited = 0, 0.0
    while got < episodes:
        t = time.perf_counter()
        part = None
        while part is None:
            part = await buffer.take.call_one(
                version, episodes - got, min(chunk, episodes - got), wait_s=0.5
            )
            if part is None:
                manager.check()
                _unstick(manager, version)
                if time.perf_counter() - t > timeout_s:
                    await _starved(buffer, version, manager, timeout_s)
        waited += time.perf_counter() - t
        await trainer.accumulate.call(part)
        got += part.input_ids_bt.shape[0]
    return (await trainer.apply_accumulated.call()).item(procs=0), waited


async def _starved(buffer: ReplayBuffer, version: int, manager, timeout_s: float) -> None:
    """Raise the error for a training loop that got no usable batch in ``timeout_s``."""
    m = await buffer.metrics.call_one()
    raise TimeoutError(
        f"no batch usable at policy version {version} after {timeout_s:.0f} s "
        f"(batch_timeout_s): the replay buffer holds {m[M.BUFFER_SIZE]:.0f} episodes, "
        f"{m[M.EVICTED_STALE]:.0f} evicted as stale so far; rollouts: {manager.counts}. "
        "Generators serving weights older than max_policy_age produce only stale episodes; "
        "check the generators' versions (forge top) and the rollout errors above"
    )


def _unstick(manager, version: int) -> None:
    if manager.unstick():
        logger.warning(
            "no rollout was running while the trainer waited for a batch at "
            "version %d (their credits went to groups too old for it): handed out "
            "a step's worth more",
            version,
        )


async def train_batch(cfg, buffer, trainer, version: int, manager, critic=None, colo=None):
    """One RL step as ``cfg`` (an ``RLConfig``) asks: the step's batch, whole
    (``train_next``; with a ``colo`` colocation the generator sleeps once it is there) or
    streamed as it arrives (``cfg.stream``), and the update. Returns (metrics, seconds
    waiting for episodes, seconds training)."""
    t0 = time.perf_counter()
    if cfg.stream:  # train on the step's first groups while the rest generate
        r = cfg.rollout
        m, waited = await train_streamed(
            buffer,
            trainer,
            version,
            manager,
            episodes=r.episodes_per_step,
            chunk=r.group_size * max(1, r.prompts_per_step // 4),
            timeout_s=cfg.batch_timeout_s,
        )
    else:
        m, waited = await train_next(
            buffer,
            trainer,
            version,
            manager,
            timeout_s=cfg.batch_timeout_s,
            critic=critic,
            before_train=colo.to_train if colo else None,
        )
    return m, waited, max(time.perf_counter() - t0 - waited, 1e-9)
