"""verifiers environments (0.4.0, ``verifiers.v1``) trained through Forge's episode runner.

::

    data: {fn: verifiers, kwargs: {load: mypkg.envs:load_environment}}
    env:  {fn: {fn: verifiers, kwargs: {load: mypkg.envs:load_environment}}, max_turns: 4}

``load`` names the environment as verifiers loads it, offline:

- ``"pkg.module:attr"``: a function returning a ``vf.Env`` (a user's ``load_environment``,
  called with ``kwargs``), or a ``vf.Env`` object;
- a taskset id (an installed taskset package, e.g. ``gsm8k-v1``): built with
  ``vf.load_environment(vf.resolve_env_config({"taskset": {"id": load}, **kwargs}))`` (so
  ``kwargs`` is an ``EnvConfig``: ``{taskset: {...}, agent: {max_turns: 4}}``).

What maps to what:

- rows: the env's taskset (``vf.Taskset`` iteration); an item carries the task's data
  (``vf_task``), ``prompt`` (its text), ``target`` (its ``answer`` field, if any) and
  ``task_id`` (``task.key``);
- the first observation: the system prompt as a system message, then the prompt;
- turns: the env's own ``run(task, agents)`` runs (a background task) with Forge's policy
  as its agent: each model turn of the verifiers rollout is one Forge turn; the user turns
  the env sends (``interaction.turn(message)``) are the observations; the episode is
  ``done`` when ``run`` returns (its completion rule, a ``@vf.stop``, or the agent's
  ``max_turns`` limit);
- rewards: the task's ``@vf.reward`` functions (verifiers' ``task.score``, rewards given by
  ``env.finalize`` too), each a named component ``name -> score * weight``, so their sum
  is verifiers' ``trace.reward``; ``@vf.metric`` values are in the final step's ``info``;
- tools: the task's ``vf.Toolset`` tools, run in-process (see ``verifiers_bridge``).
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from forge.envs.messages import Message, StepResult
from forge.integrations.verifiers_bridge import BridgeAgents, Channel
from forge.plugins import import_string

__all__ = ["VerifiersEnv", "VerifiersSource", "load_env"]


def _verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(
            "the verifiers adapter needs the verifiers package (0.4): pip install "
            "'forge[envs]' (or pip install 'verifiers==0.4.*')"
        ) from e
    return vf


def load_env(load: str, kwargs: dict | None = None) -> Any:
    """The ``vf.Env`` that ``load`` names (see the module docstring), built once per
    ``(load, kwargs)`` in a process. ``ValueError`` says what did not load."""
    return _load(load, json.dumps(kwargs or {}, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _load(load: str, kwargs_json: str) -> Any:
    vf = _verifiers()
    kwargs = json.loads(kwargs_json)
    if not isinstance(load, str) or not load:
        raise ValueError(f"verifiers: load must be 'pkg.module:attr' or a taskset id, got {load!r}")
    if ":" in load:
        obj = import_string(load)
        env = obj if isinstance(obj, vf.Env) else None
        if env is None and callable(obj):
            env = obj(**kwargs)
        elif env is not None and kwargs:
            raise ValueError(f"verifiers: {load!r} is an env object; it takes no kwargs")
    else:
        try:
            config = vf.resolve_env_config(
                {**kwargs, "taskset": {**kwargs.get("taskset", {}), "id": load}}
            )
            env = vf.load_environment(config)
        except (ImportError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"verifiers: {load!r} is neither 'pkg.module:attr' nor a taskset verifiers can "
                f"load offline ({type(e).__name__}: {e})"
            ) from None
    if not isinstance(env, vf.Env):
        raise ValueError(
            f"verifiers: {load!r} gave a {type(env).__name__}, not a verifiers Env; it must "
            "return one (e.g. vf.load_environment(vf.resolve_env_config({...})))"
        )
    return env


def _item(task: Any) -> dict:
    """A data-source item for one ``vf.Task`` (picklable: JSON-like)."""
    data = task.data
    return {
        "vf_task": data.model_dump(mode="json", exclude_none=True),
        "prompt": data.prompt_text,
        "target": getattr(data, "answer", None),
        "task_id": task.key,
    }


def _task(env: Any, item: Any) -> Any:
    """The ``vf.Task`` for a data-source item (or a dict of the task's data fields)."""
    task_cls = type(env.taskset).task_type()
    raw = item.get("vf_task", item) if isinstance(item, dict) else item
    return task_cls(task_cls.data_type().model_validate(raw), env.taskset.config.task)


class VerifiersEnv:
    """One episode of a verifiers environment as a Forge environment (``reset``/``step``).

    ``load``/``kwargs``: the environment (module docstring). ``role``: which of the env's
    agents the policy plays (default: its only one). Roles other than it are not served.
    """

    @staticmethod
    def check_config(load: str = "", kwargs: dict | None = None, role: str = "") -> None:
        """At config load: an import-string ``load`` must import (nothing is built)."""
        if not isinstance(load, str) or not load:
            raise ValueError(
                f"verifiers: load must be 'pkg.module:attr' or a taskset id, got {load!r}"
            )
        if ":" in load:
            import_string(load)

    def __init__(self, load: str, kwargs: dict | None = None, role: str = "") -> None:
        self.env = load_env(load, kwargs)
        from verifiers.v1.configs.agent import agent_config_fields

        roles = list(agent_config_fields(self.env.config))
        if (role and role not in roles) or (not role and len(roles) != 1):
            raise ValueError(
                f"verifiers env {type(self.env).__name__} has no role {role!r}; its roles "
                f"are {roles}: set role to the one the policy plays"
            )
        self.role = role or roles[0]
        self.channel = Channel()
        self.runner: Any = None
        self.traces: list = []

    async def reset(self, task: Any) -> list[Message]:
        """Start the env's ``run`` on ``task``; return the messages of the first model turn."""
        self.task = _task(self.env, task)
        agents = BridgeAgents(self.env, self.role, self.channel, self.traces)
        self.runner = _start(self._episode(agents))
        kind, value = await self.channel.next_event()
        if kind == "ask":
            return value
        if kind == "error":
            raise value
        raise RuntimeError(
            f"verifiers env {type(self.env).__name__} ended before the policy's first turn"
        )

    async def step(self, action: str) -> StepResult:
        """The model's turn to the env; its next user/tool messages, or the scored end."""
        await self.channel.answer(action)
        kind, value = await self.channel.next_event()
        if kind == "ask":
            return StepResult(value)
        if kind == "error":
            raise value
        return value

    async def close(self) -> None:
        """Cancel the env's ``run`` if the episode ended before it did (Forge's limits)."""
        if self.runner is not None and not self.runner.done():
            self.runner.cancel()
            await asyncio.gather(self.runner, return_exceptions=True)

    async def _episode(self, agents: BridgeAgents) -> None:
        vf = _verifiers()
        from verifiers.v1.trace import TraceTask

        try:
            episode = vf.Episode(
                env=vf.EnvInfo(id=self.env.config.env_id),
                task=TraceTask(
                    type=type(self.task).__name__,
                    data=self.task.data,
                    key=self.task.key,
                    hash=self.task.hash,
                ),
            )
            await self.env.setup(agents)
            await self.env.run(self.task, agents)
            episode.traces = list(self.traces)
            await self.env.finalize(self.task, episode)
            await self.channel.events.put(("end", self._result()))
        except Exception as e:  # noqa: BLE001 - handed to Forge's step, which ends as env_error
            await self.channel.events.put(("error", e))

    def _result(self) -> StepResult:
        """The policy's trace scored: each reward ``name -> score * weight``."""
        trace = self.traces[-1] if self.traces else None  # the policy's (only it is served)
        if trace is None:
            raise RuntimeError(f"verifiers env {type(self.env).__name__} ran no policy turn")
        rewards = {k: r.score * r.weight for k, r in trace.rewards.items() if r is not None}
        info = {
            "stop_condition": trace.stop_condition,
            "vf_reward": trace.reward,
            "metrics": dict(trace.metrics),
            "weights": {k: r.weight for k, r in trace.rewards.items() if r is not None},
        }
        return StepResult(None, reward=rewards, done=True, info=info)


def _start(coro: Any) -> Any:
    return asyncio.get_running_loop().create_task(coro)


class VerifiersSource:
    """The rows of a verifiers env's taskset as a Forge data source.

    The first ``heldout_size`` tasks are held out (``heldout()``), the rest are sampled in
    a shuffled, repeating order; ``limit`` bounds an infinite taskset (required there).
    """

    def __init__(
        self,
        load: str,
        kwargs: dict | None = None,
        heldout_size: int = 0,
        limit: int | None = None,
        seed: int = 0,
    ) -> None:
        from forge.data.sources import RecordSource

        env = load_env(load, kwargs)
        taskset = env.taskset
        if limit is not None:
            taskset = taskset.take(limit)
        elif not taskset.bounded:
            raise ValueError(
                f"verifiers taskset {type(env.taskset).__name__} is infinite; set limit"
            )
        items = [_item(t) for t in taskset]
        if heldout_size >= len(items):
            raise ValueError(
                f"verifiers: heldout_size={heldout_size} leaves no training rows of {len(items)}"
            )
        self._records = RecordSource(items[heldout_size:], items[:heldout_size], seed)

    def sample(self) -> dict:
        return self._records.sample()

    def heldout(self) -> list[dict]:
        return self._records.heldout()

    def state_dict(self) -> dict:
        return self._records.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._records.load_state_dict(state)
