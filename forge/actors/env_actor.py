"""EnvActor: environments in their own processes, run as a service (one episode = one session).

Endpoints (``async``; called with ``route`` inside a session so an episode's calls all reach
the replica holding its environment; ``RemoteEnv`` does this for you):

- ``reset(episode_id, task) -> observation``: builds a fresh environment with
  ``forge.envs.build_env(spec, **env_kwargs)``, keeps it under ``episode_id`` (replacing and
  closing an older one of that id) and returns its ``reset(task)``.
- ``step(episode_id, action) -> StepResult``: that environment's ``step(action)``. An
  unknown id (never reset, closed, or lost with a restarted replica) is a ``KeyError``.
- ``close(episode_id)``: closes and forgets the environment (unknown ids are ignored).
- ``num_episodes() -> int``: environments currently held (tests, metrics).

Environment methods that are plain ``def`` run in worker threads, so one slow environment
does not stall the other episodes of its replica. Errors raised by an environment come back
to the caller as ``ActorError``; ``run_episode`` turns them into an "env_error" trajectory.

::

    envs = await EnvActor.options(num_replicas=4, procs=1).as_service("my_pkg.envs:Sokoban")
    env = RemoteEnv(envs)                  # one per episode
    traj = await run_episode(env, task, generator.generate.route, tokenizer)   # closes env
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from controller import endpoint
from forge.actors.forge_actor import ForgeActor
from forge.envs.environment import Environment, build_env, call_env
from forge.envs.messages import Message, StepResult
from forge.observability import Reduce, record_metric

__all__ = ["EnvActor", "RemoteEnv"]

logger = logging.getLogger("forge.envs")


class EnvActor(ForgeActor):
    """Hosts one environment per live episode. See the module docstring.

    Args:
        spec: what ``build_env`` takes: an environment class, a factory, or an import
            string ``"package.module:attr"``.
        env_kwargs: keyword arguments for every environment built.
    """

    _busy_name = "env"

    def __init__(self, spec: Any, env_kwargs: dict[str, Any] | None = None):
        from forge.slots import ENVIRONMENT

        # Any form the ENVIRONMENT slot takes: a class, a factory, "pkg.module:attr", or
        # {fn, kwargs} / PluginSpec (resolved here, in the replica's own process).
        self.spec = ENVIRONMENT.resolve(spec, key="EnvActor spec")
        self.env_kwargs = dict(env_kwargs or {})
        self._envs: dict[str, Any] = {}

    @endpoint
    async def reset(self, episode_id: str, task: Any) -> list[Message] | str:
        await self._close(episode_id)
        env = build_env(self.spec, **self.env_kwargs)
        self._envs[episode_id] = env
        record_metric("env/episodes_started", 1, Reduce.SUM)
        with self.busy():
            return await call_env(env.reset, task)

    @endpoint
    async def step(self, episode_id: str, action: str) -> StepResult:
        env = self._envs.get(episode_id)
        if env is None:
            raise KeyError(
                f"no environment for episode {episode_id!r} on this replica: reset it first "
                "(or it was closed, or the replica restarted), and call inside one session"
            )
        with self.busy():
            return await call_env(env.step, action)

    @endpoint
    async def close(self, episode_id: str) -> None:
        await self._close(episode_id)

    @endpoint
    async def num_episodes(self) -> int:
        return len(self._envs)

    async def _close(self, episode_id: str) -> None:
        env = self._envs.pop(episode_id, None)
        if env is not None and callable(getattr(env, "close", None)):
            try:
                await call_env(env.close)
            except Exception:  # noqa: BLE001 - a failing close must not fail the caller
                logger.exception("closing the environment of episode %s failed", episode_id)


class RemoteEnv(Environment):
    """An ``Environment`` whose instance lives in an ``EnvActor`` (service or single actor).

    With a service, ``reset`` opens a sticky session so that every call of the episode goes
    to one replica; ``close`` (which ``run_episode`` calls) frees the remote environment and
    ends the session. Use one ``RemoteEnv`` per episode.
    """

    def __init__(self, handle: Any, episode_id: str | None = None) -> None:
        self.handle = handle
        self.episode_id = episode_id or uuid.uuid4().hex
        self._is_service = callable(getattr(handle, "start_session", None))
        self._sid: str | None = None

    async def _call(self, name: str, *args: Any) -> Any:
        ep = getattr(self.handle, name)
        if self._is_service:
            return await ep.route(*args, sess_id=self._sid)
        return await ep.call_one(*args)

    async def reset(self, task: Any) -> list[Message] | str:
        if self._is_service and self._sid is None:
            self._sid = await self.handle.start_session()
        return await self._call("reset", self.episode_id, task)

    async def step(self, action: str) -> StepResult:
        if self._is_service and self._sid is None:
            raise RuntimeError("RemoteEnv.step before reset: call reset(task) first")
        return await self._call("step", self.episode_id, action)

    async def close(self) -> None:
        if self._is_service and self._sid is None:
            return
        try:
            await self._call("close", self.episode_id)
        finally:
            if self._is_service:
                sid, self._sid = self._sid, None
                await self.handle.terminate_session(sid)
