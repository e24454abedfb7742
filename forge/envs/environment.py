"""The environment interface, a functional form of it, and ``build_env``.

An environment hosts one episode at a time::

    class Countdown(Environment):
        async def reset(self, task) -> list[Message] | str:
            self.target = task["target"]
            return f"Reach {self.target}."            # a user message (or chat messages)

        async def step(self, action: str) -> StepResult:
            ok = action.strip() == str(self.target)
            return StepResult("Correct." if ok else "Try again.", reward=float(ok), done=ok)

``reset``/``step``/``close`` may also be plain ``def`` methods: callers go through
:func:`call_env`, which runs them in a worker thread so a slow environment does not stall an
event loop. Environments keep per-episode state, so each episode gets a fresh instance from
:func:`build_env`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from forge.envs.messages import Message, StepResult

__all__ = ["Environment", "FunctionEnv", "build_env", "call_env"]


class Environment:
    """Base class of environments (duck typing works too: anything with reset and step)."""

    async def reset(self, task: Any) -> list[Message] | str:
        """Start an episode for ``task``; return the initial observation."""
        raise NotImplementedError

    async def step(self, action: str) -> StepResult:
        """React to the model's turn ``action`` (its text)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release resources; called once when the episode is over."""


async def call_env(fn: Callable[..., Any], *args: Any) -> Any:
    """``await fn(*args)`` for an ``async def``; a plain function runs in a worker thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


class FunctionEnv(Environment):
    """An environment from two plain functions sharing a per-episode ``state`` dict.

    ``reset_fn(state, task) -> observation`` and ``step_fn(state, action) -> StepResult``;
    ``state`` starts empty at every ``reset`` and the functions keep whatever they need in
    it. Either may be ``async``. Example::

        def reset(state, task):
            state["answer"] = task["answer"]
            return task["question"]

        def step(state, action):
            ok = action.strip() == state["answer"]
            return StepResult(None, reward=float(ok), done=True)

        make_env = functools.partial(FunctionEnv, reset, step)   # a factory for build_env
    """

    def __init__(
        self,
        reset_fn: Callable[[dict, Any], Any],
        step_fn: Callable[[dict, str], Any],
        close_fn: Callable[[dict], Any] | None = None,
    ) -> None:
        for name, fn in (("reset_fn", reset_fn), ("step_fn", step_fn)):
            if not callable(fn):
                raise TypeError(f"FunctionEnv {name} must be callable, got {type(fn).__name__}")
        self.reset_fn, self.step_fn, self.close_fn = reset_fn, step_fn, close_fn
        self.state: dict[str, Any] = {}

    async def reset(self, task: Any) -> list[Message] | str:
        self.state = {}
        return await call_env(self.reset_fn, self.state, task)

    async def step(self, action: str) -> StepResult:
        return await call_env(self.step_fn, self.state, action)

    async def close(self) -> None:
        if self.close_fn is not None:
            await call_env(self.close_fn, self.state)


def _resolve(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"environment spec {spec!r} is not an import string; write 'package.module:attr'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"environment spec {spec!r}: cannot import {module_name!r} ({e})") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"environment spec {spec!r}: {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def build_env(spec: str | Callable[..., Any], **kwargs: Any) -> Any:
    """A fresh environment for one episode.

    ``spec`` is an environment class, a factory function returning an environment, or an
    import string ``"package.module:attr"`` naming either; ``kwargs`` go to the class or
    factory. ``ValueError`` for a string that does not resolve, ``TypeError`` for a spec
    that is not callable (e.g. an environment *instance*: episodes need fresh ones) or a
    result without ``reset`` and ``step``.
    """
    where = spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))
    factory = _resolve(spec) if isinstance(spec, str) else spec
    if not callable(factory) or isinstance(factory, Environment):
        raise TypeError(
            f"environment spec {where!r} is a {type(factory).__name__}, not a class or "
            "factory; pass the class (or a function returning a new environment) so each "
            "episode gets a fresh one"
        )
    env = factory(**kwargs)
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise TypeError(
            f"environment spec {where!r} made a {type(env).__name__}, which has no reset/step; "
            "return an Environment (see forge.envs.Environment)"
        )
    return env
