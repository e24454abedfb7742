"""What a run does when a process holding training state dies mid-run.

The trainer, the replay buffer and the data source are single actors whose state a
checkpoint holds (``forge.run.Checkpointer``); generators, reward and env replicas are
services that restart themselves. The app names the actors a checkpoint restores::

    async def train(cfg, run_dir, resume, roles: Roles) -> dict:
        trainer = await Trainer.as_actor(cfg.trainer)
        roles.watch(trainer, "trainer")
        ...

    result = await Supervisor(run_dir, cfg.checkpoint_every, cfg.restart_on_failure).run(
        train, cfg, run_dir, resume)

When a watched actor's process dies, ``train`` fails with ``ActorDiedError`` (at the next
call to it; every step calls the trainer, so within a step of the death):

* ``restart_on_failure: 0`` (the default): the run stops with ``TrainerDiedError``, naming the
  role and the process (mesh, rank, pid, signal) and the last checkpoint; ``forge run`` adds
  the ``forge run --resume <run_dir>`` command and exits non-zero, after stopping every
  process.
* ``restart_on_failure: N``: up to N times, every actor of the run is stopped and ``train``
  starts again from the last checkpoint (``resume=True``), with a ``[forge] ... restarting``
  line in the log. Steps after that checkpoint are done again. Needs ``checkpoint_every > 0``
  (``check_restarts``, called when the config loads).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from controller import ActorDiedError, ForgeRuntimeError, shutdown
from forge.run.checkpoint import Checkpointer

__all__ = ["Roles", "Supervisor", "TrainerDiedError", "check_restarts"]


class Roles:
    """The actors whose state a checkpoint restores, named by the app (``watch``)."""

    def __init__(self) -> None:
        self._by_pid: dict[int, str] = {}

    def watch(self, actor: Any, role: str) -> Any:
        """Count the death of any process of ``actor`` (an actor mesh) as the death of
        ``role`` (e.g. ``"trainer"``); returns ``actor``."""
        for pid in actor.pids:
            self._by_pid[pid] = role
        return actor

    def died(self, exc: BaseException | None) -> tuple[str, ActorDiedError] | None:
        """``(role, error)`` if ``exc`` or one of its causes is the death of a watched
        process, else ``None``."""
        seen = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, ActorDiedError) and exc.pid in self._by_pid:
                return self._by_pid[exc.pid], exc
            exc = exc.__cause__ or exc.__context__
        return None


class TrainerDiedError(ForgeRuntimeError):
    """A run stopped because a process holding training state (its ``role``: the trainer,
    replay buffer or data source) died and no restart was left. ``died`` is the
    ``ActorDiedError`` (mesh, rank, pid, signal); ``checkpoint_step`` the step of the last
    checkpoint (``None``: none written)."""

    def __init__(
        self,
        role: str,
        died: ActorDiedError,
        checkpoint_step: int | None,
        checkpoint_dir: Path | None,
        restarts: int,
        max_restarts: int,
    ):
        self.role, self.died = role, died
        self.checkpoint_step, self.checkpoint_dir = checkpoint_step, checkpoint_dir
        self.restarts, self.max_restarts = restarts, max_restarts
        where = (
            f"last checkpoint: step {checkpoint_step} ({checkpoint_dir})"
            if checkpoint_step is not None
            else "no checkpoint was written (set checkpoint_every > 0), a resume starts at step 0"
        )
        super().__init__(
            f"the run's {role} died: {died}; {where}; restarts used: {restarts} of "
            f"restart_on_failure={max_restarts}"
        )

    def __reduce__(self):
        args = (self.role, self.died, self.checkpoint_step, self.checkpoint_dir)
        return (TrainerDiedError, (*args, self.restarts, self.max_restarts))


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


class Supervisor:
    """Runs ``train`` and restarts it from the last checkpoint when a watched actor dies."""

    def __init__(self, run_dir: Path, checkpoint_every: int, restart_on_failure: int):
        check_restarts(restart_on_failure, checkpoint_every)
        self.ckpt = Checkpointer(run_dir, checkpoint_every)
        self.max_restarts = restart_on_failure

    async def run(
        self, train: Callable[..., Awaitable[dict[str, Any]]], cfg, run_dir: Path, resume: bool
    ) -> dict[str, Any]:
        """``await train(cfg, run_dir, resume, roles)``, restarted up to ``restart_on_failure``
        times; returns train's result plus ``"restarts"``. Raises ``TrainerDiedError`` past
        the bound; any other error goes through unchanged."""
        restarts = 0
        while True:
            roles = Roles()
            try:
                return {**await train(cfg, run_dir, resume, roles), "restarts": restarts}
            except Exception as e:
                found = roles.died(e)
                if found is None:
                    raise
                role, died = found
                step, path = self.ckpt.latest_step(), self.ckpt.latest()
                if restarts >= self.max_restarts:
                    raise TrainerDiedError(
                        role, died, step, path, restarts, self.max_restarts
                    ) from e
                restarts += 1
                start = f"checkpoint step {step}" if step is not None else "step 0 (no checkpoint)"
                print(
                    f"[forge] the {role} died ({died}); restarting the run from {start} "
                    f"(restart {restarts} of {self.max_restarts})",
                    flush=True,
                )
                await shutdown()  # every actor of the failed attempt: the next one spawns afresh
                resume = True
