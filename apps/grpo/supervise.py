"""What a GRPO run does when a process holding training state dies mid-run.

The trainer, the replay buffer and the data source are single actors whose state the
checkpoint holds (``Checkpointer``); generators, reward and env replicas are services that
restart themselves. When one of the former dies, ``train`` fails with ``ActorDiedError``:

* ``restart_on_failure: 0`` (the default): the run stops with ``TrainerDiedError``, naming the
  process (mesh, rank, pid, signal) and the last checkpoint; ``forge run`` adds the
  ``forge run --resume <run_dir>`` command and exits non-zero, after stopping every process.
* ``restart_on_failure: N``: up to N times, every actor of the run is stopped and ``train``
  starts again from the last checkpoint (``resume=True``), with a ``[grpo] ... restarting``
  line in the log. Steps after that checkpoint are done again. Needs ``checkpoint_every > 0``
  (checked when the config loads).

A death is noticed at the next call to the dead actor (every step calls the trainer), so a
run stops, or restarts, within a step of the kill.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from apps.grpo.state import Checkpointer
from controller import ActorDiedError, ForgeRuntimeError, shutdown

# Actors whose state a checkpoint restores, by mesh name prefix (names are "<class>-<n>").
ROLES = {"Trainer": "trainer", "ReplayBuffer": "replay buffer", "DatasetActor": "data source"}


class TrainerDiedError(ForgeRuntimeError):
    """A GRPO run stopped because its trainer (or replay buffer, or data source) process
    died and no restart was left. ``died`` is the ``ActorDiedError`` (mesh, rank, pid,
    signal); ``checkpoint_step`` the step of the last checkpoint (``None``: none written)."""

    def __init__(
        self,
        died: ActorDiedError,
        checkpoint_step: int | None,
        checkpoint_dir: Path | None,
        restarts: int,
        max_restarts: int,
    ):
        self.died = died
        self.checkpoint_step = checkpoint_step
        self.checkpoint_dir = checkpoint_dir
        self.restarts = restarts
        self.max_restarts = max_restarts
        super().__init__(_message(died, checkpoint_step, checkpoint_dir, restarts, max_restarts))

    def __reduce__(self):
        return (
            TrainerDiedError,
            (
                self.died,
                self.checkpoint_step,
                self.checkpoint_dir,
                self.restarts,
                self.max_restarts,
            ),
        )


def _role(mesh: str) -> str:
    return next(role for prefix, role in ROLES.items() if mesh.startswith(prefix))


def _message(died, step, path, restarts, max_restarts) -> str:
    where = (
        f"last checkpoint: step {step} ({path})"
        if step is not None
        else "no checkpoint was written (set checkpoint_every > 0), a resume starts at step 0"
    )
    return (
        f"the GRPO run's {_role(died.mesh)} died: {died}; {where}; restarts used: "
        f"{restarts} of restart_on_failure={max_restarts}"
    )


def check_restarts(restart_on_failure: int, checkpoint_every: int) -> None:
    """Config check: restarts need a bound >= 0 and checkpoints to restart from."""
    if restart_on_failure < 0:
        raise ValueError(f"restart_on_failure must be >= 0, got {restart_on_failure}")
    if restart_on_failure and checkpoint_every <= 0:
        raise ValueError(
            f"restart_on_failure={restart_on_failure} restarts the run from its last "
            "checkpoint, but checkpoint_every=0 writes none; set checkpoint_every > 0 "
            "(e.g. checkpoint_every=10) or restart_on_failure=0"
        )


def restorable_death(exc: BaseException) -> ActorDiedError | None:
    """The ``ActorDiedError`` of a checkpointed actor in ``exc`` or its causes, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ActorDiedError) and exc.mesh.startswith(tuple(ROLES)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


async def train_with_restarts(
    train: Callable[..., Awaitable[dict[str, Any]]], cfg, run_dir: Path, resume: bool
) -> dict[str, Any]:
    """``await train(cfg, run_dir, resume)``, restarted from the last checkpoint up to
    ``cfg.restart_on_failure`` times when the trainer, replay buffer or data source dies.
    Returns train's result plus ``"restarts"``; raises ``TrainerDiedError`` past the bound."""
    ckpt = Checkpointer(run_dir, cfg.checkpoint_every)
    restarts = 0
    while True:
        try:
            result = await train(cfg, run_dir, resume)
        except Exception as e:
            died = restorable_death(e)
            if died is None:
                raise
            step, path = ckpt.latest_step(), ckpt.latest()
            if restarts >= cfg.restart_on_failure:
                raise TrainerDiedError(died, step, path, restarts, cfg.restart_on_failure) from e
            restarts += 1
            print(
                f"[grpo] {_role(died.mesh)} died ({died}); restarting the run from "
                f"{f'checkpoint step {step}' if step is not None else 'step 0 (no checkpoint yet)'}"
                f" (restart {restarts} of {cfg.restart_on_failure})",
                flush=True,
            )
            await shutdown()  # every actor of the failed attempt: the next one spawns afresh
            resume = True
            continue
        return {**result, "restarts": restarts}
