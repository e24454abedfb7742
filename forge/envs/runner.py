"""Run one multi-turn episode, token-in/token-out, and return its :class:`Trajectory`.

::

    async with generator.session():              # every turn on one replica (KV/prefix reuse)
        traj = await run_episode(
            build_env(MyEnv), task, generator.generate.route, tokenizer,
            max_turns=4, max_context_tokens=4096, sampling={"max_tokens": 512},
            tools=ToolSet([python_tool()]),
        )

``generate(prompt_ids, **sampling) -> list[Completion]`` is any (async) function; the
Generator's ``generate.route``/``call_one`` take token-id prompts as they are.

How the token ids grow (never re-rendered, never re-tokenised)::

    [prompt: template(initial messages) + generation prompt]          mask 0
    [turn 1: the sampled ids, verbatim, with their logprobs]          mask 1
    [close: template tokens ending the assistant message]             mask 0
    [observation: template(tool/env messages) + generation prompt]    mask 0
    [turn 2 ...]

With a history window (``history``, ``forge.envs.window``) each later turn is prompted
afresh with the window's messages instead, and its prompt starts a new row of the
trajectory (``Trajectory.row_starts``)::

    [prompt 1] [turn 1]  |  [prompt 2: template(window) + generation prompt] [turn 2]  | ...

A turn whose text holds tool calls (when ``tools`` is given) is answered by executing them
(the environment is not stepped; the turn's reward is 0); any other turn goes to
``env.step``. The episode ends when the environment says ``done`` ("done"), after
``max_turns`` model turns ("max_turns"), when the next prompt would not leave room to
generate within ``max_context_tokens`` or a turn was cut to fit it ("max_context",
``truncated``), when a turn hits ``max_tokens`` and ``end_on_length`` ("length",
``truncated``), or when ``reset``/``step`` raises or outlasts ``step_timeout_s``
("env_error", with the error in ``info["error"]``). Environment failures never propagate:
there are no retries here (the caller may run the task again, e.g. on another replica);
failures of ``generate`` do propagate.

Metrics (``forge.observability``): ``env/turns`` and ``env/sampled_tokens`` (mean),
``env/finish/<reason>`` and ``env/errors`` (sum), ``env/template_fallbacks`` (sum) and the
tool metrics of :class:`~forge.envs.tools.ToolSet`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.envs.chat import ChatRenderer
from forge.envs.environment import call_env
from forge.envs.messages import (
    EnvContractError,
    Message,
    Trajectory,
    as_observation,
    as_step_result,
)
from forge.envs.tool_parser import HermesToolParser, ToolParser
from forge.envs.tools import ToolSet
from forge.envs.window import HistoryWindow, window_messages
from forge.observability import Reduce, record_metric

__all__ = ["EnvError", "run_episode", "sum_rewards"]

logger = logging.getLogger("forge.envs")


class EnvError(Exception):
    """An environment's reset/step failed or timed out (ends the episode as "env_error")."""


def sum_rewards(turn_rewards: list[float | dict[str, float]]) -> float:
    """The default episode reward: the sum of the scalar turn rewards (dicts count 0)."""
    return float(sum(r for r in turn_rewards if not isinstance(r, dict)))


class _Builder:
    """The growing token sequence of one episode and its per-turn records."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turn_versions: list[int] = []
        self.turn_rewards: list[float | dict[str, float]] = []
        self.turn_spans: list[tuple[int, int]] = []
        self.turn_states: list[Any] = []
        self.row_starts: list[int] = []  # history windows: where each later turn's row begins
        self.state: Any = ""  # the key of the state the next turn is taken in
        self.messages: list[Message] = []
        self.prompt_length = 0
        self.info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0}

    def add_context(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if len(logprobs) != len(ids):
            raise ValueError(
                f"generate returned {len(ids)} token ids but {len(logprobs)} logprobs; "
                "multi-turn training needs the sampled tokens' logprobs (logprobs=True)"
            )
        start = len(self.token_ids)
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.turn_spans.append((start, len(self.token_ids)))
        self.turn_versions.append(version)
        self.turn_states.append(self.state)

    def trajectory(self, task_id: str, target: Any, reason: str, truncated: bool, aggregate):
        components: dict[str, float] = {}
        for r in self.turn_rewards:
            if isinstance(r, dict):
                for name, value in r.items():
                    components[name] = components.get(name, 0.0) + float(value)
        return Trajectory(
            task_id=task_id,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            turn_versions=self.turn_versions,
            turn_rewards=self.turn_rewards,
            reward=float(aggregate(self.turn_rewards)),
            reward_components=components,
            num_turns=len(self.turn_spans),
            finish_reason=reason,
            truncated=truncated,
            messages=self.messages,
            target=target,
            prompt_length=self.prompt_length,
            turn_spans=self.turn_spans,
            info=self.info,
            turn_states=self.turn_states,
            row_starts=self.row_starts,
        )


async def _env_call(fn: Callable[..., Any], arg: Any, timeout_s: float | None) -> Any:
    try:
        return await asyncio.wait_for(call_env(fn, arg), timeout_s)
    except asyncio.TimeoutError as e:
        raise EnvError(
            f"{getattr(fn, '__name__', 'env call')} timed out after {timeout_s} s"
        ) from e
    except Exception as e:  # noqa: BLE001 - any environment failure ends only this episode
        detail = "".join(traceback.format_exception(e)).strip()
        raise EnvError(f"{type(e).__name__}: {e}\n{detail}") from e


async def _sample(generate, prompt_ids: list[int], sampling: dict[str, Any]):
    out = generate(list(prompt_ids), **sampling)
    if inspect.isawaitable(out):
        out = await out
    if not isinstance(out, list) or len(out) != 1:
        raise ValueError(
            f"generate must return a list of one Completion per call, got {out!r:.200}; "
            "multi-turn episodes sample one continuation per turn (n=1)"
        )
    return out[0]


def _task_fields(task: Any, task_id: str | None) -> tuple[str, Any]:
    if isinstance(task, dict):
        tid = task_id or task.get("task_id") or task.get("id")
        return str(tid if tid is not None else uuid.uuid4().hex), task.get("target")
    return task_id or uuid.uuid4().hex, None


@dataclass
class _Settings:
    max_turns: int
    max_context: int
    sampling: dict[str, Any]
    tools: ToolSet | None
    parser: ToolParser
    version_of: Callable[[Any], int] | None
    step_timeout_s: float | None
    end_on_length: bool
    final_observation: bool = False
    window: HistoryWindow | None = None


async def run_episode(
    env: Any,
    task: Any,
    generate: Callable[..., Any],
    tokenizer: Any,
    *,
    max_turns: int = 8,
    max_context_tokens: int = 2048,
    sampling: dict[str, Any] | None = None,
    tools: ToolSet | None = None,
    parser: ToolParser | None = None,
    version_of: Callable[[Any], int] | None = None,
    step_timeout_s: float | None = None,
    end_on_length: bool = False,
    final_observation: bool = False,
    history: HistoryWindow | None = None,
    aggregate_reward: Callable[[list[float | dict[str, float]]], float] = sum_rewards,
    task_id: str | None = None,
    close_env: bool = True,
) -> Trajectory:
    """Play one episode of ``env`` on ``task`` with the policy behind ``generate``.

    Args:
        env: an environment (``reset``/``step``, sync or async; see ``forge.envs.environment``).
        task: passed to ``env.reset``. A dict may carry ``task_id`` (or ``id``) and
            ``target``, copied to the trajectory.
        generate: ``generate(prompt_ids, **sampling) -> list[Completion]`` (one completion).
        tokenizer: the policy's HF tokenizer, with a chat template.
        max_turns: most model turns (tool-call turns included).
        max_context_tokens: the trajectory never grows past this many tokens; a turn's
            ``max_tokens`` is lowered to what is left.
        sampling: keyword arguments for ``generate`` (``max_tokens``, ``temperature``...);
            without ``max_tokens`` a turn may use all the context left.
        tools: tools the model may call (advertised in the prompt, executed here).
        parser: reads tool calls from the model's text (default ``HermesToolParser``).
        version_of: ``completion -> policy version`` (default ``generator_version``).
        step_timeout_s: bound on each ``env.reset``/``env.step`` call.
        end_on_length: end the episode ("length") when a turn hits ``max_tokens``.
        final_observation: when the episode ends by ``max_turns`` (not done: truncated in
            time), append the environment's last answer as context tokens (mask 0), so the
            state after the last turn is in the trajectory (``info["final_state_at"]``: its
            length then) for a critic to bootstrap from.
        history: prompt each turn with a window of the game (``forge.envs.window``)
            instead of the whole conversation; each later turn's prompt then starts a new
            row of the trajectory (``Trajectory.row_starts``) and ``max_context_tokens``
            bounds each row.
        aggregate_reward: ``turn_rewards -> reward`` (default: sum of scalar rewards).
        task_id: overrides the id taken from ``task``.
        close_env: call ``env.close()`` at the end (errors there are logged only).

    Returns the :class:`Trajectory`; see the module docstring for how episodes end.
    """
    sampling = dict(sampling or {})
    if sampling.get("n", 1) != 1:
        raise ValueError(f"run_episode samples one continuation per turn; got n={sampling['n']}")
    if max_turns < 1 or max_context_tokens < 2:
        raise ValueError(
            f"run_episode needs max_turns >= 1 and max_context_tokens >= 2, got {max_turns} "
            f"and {max_context_tokens}"
        )
    if history is not None and final_observation:
        raise ValueError(
            "final_observation keeps the state after the last turn at the end of the "
            "episode's one token sequence, for a critic over turns; with a history window "
            "each turn is its own row: drop one of them"
        )
    settings = _Settings(
        max_turns,
        max_context_tokens,
        sampling,
        tools,
        parser or HermesToolParser(),
        version_of,
        step_timeout_s,
        end_on_length,
        final_observation,
        history,
    )
    tid, target = _task_fields(task, task_id)
    b = _Builder()
    try:
        reason, truncated = await _play(env, task, generate, tokenizer, b, settings)
    except EnvError as e:
        reason, truncated = "env_error", False
        b.info["error"] = str(e)
        record_metric("env/errors", 1, Reduce.SUM)
        logger.warning("episode %s: environment error: %s", tid, str(e).splitlines()[0])
    finally:
        if close_env and callable(getattr(env, "close", None)):
            try:
                await call_env(env.close)
            except Exception:  # noqa: BLE001 - closing must not lose the episode
                logger.exception("episode %s: env.close() failed", tid)
    record_metric(f"env/finish/{reason}", 1, Reduce.SUM)
    record_metric("env/turns", len(b.turn_spans), Reduce.MEAN)
    record_metric("env/sampled_tokens", sum(b.loss_mask), Reduce.MEAN)
    return b.trajectory(tid, target, reason, truncated, aggregate_reward)


async def _play(env, task, generate, tokenizer, b: _Builder, s: _Settings) -> tuple[str, bool]:
    """The turn loop; fills ``b``, returns ``(finish_reason, truncated)``."""
    first = as_observation(await _env_call(env.reset, task, s.step_timeout_s), "env.reset")
    template_kwargs: dict[str, Any] = {}
    if s.tools is not None and len(s.tools):
        first, template_kwargs = s.tools.prepare(first, tokenizer)
    b.messages += first
    b.state = _state_key(None, first)
    chat = ChatRenderer(tokenizer, template_kwargs)
    prompt = chat.prompt_ids(b.messages)
    b.prompt_length = len(prompt)
    if len(prompt) >= s.max_context:
        return "max_context", True  # no room to sample a single token
    b.add_context(prompt)
    context = b.token_ids  # what the next turn is sampled from (grows with the episode)
    requested = s.sampling.get("max_tokens")
    for turn in range(s.max_turns):
        room = s.max_context - len(context)  # >= 1: checked before each turn
        cap = room if requested is None else min(requested, room)
        c = await _sample(generate, context, {**s.sampling, "max_tokens": cap})
        b.add_sampled(list(c.token_ids), list(c.logprobs), _version(c, s.version_of))
        b.messages.append({"role": "assistant", "content": c.text})
        if c.stop_reason == "length" and (requested is None or cap < requested):
            return "max_context", True
        if c.stop_reason == "length" and s.end_on_length:
            return "length", True
        history = list(b.messages)
        new, done = await _respond(env, c.text, b, s)
        b.messages += new
        if done:
            return "done", False
        last = turn == s.max_turns - 1
        if last and not s.final_observation:
            return "max_turns", False
        if s.window is not None:
            row = chat.prompt_ids(window_messages(b.messages, s.window))
            if len(row) >= s.max_context:
                return "max_context", True
            b.row_starts.append(len(b.token_ids))
            b.add_context(row)
            context = row
            continue
        close = chat.close_ids(list(c.token_ids))
        fallbacks = chat.fallbacks
        suffix = chat.suffix_ids(history, new)
        if chat.fallbacks > fallbacks:
            record_metric("env/template_fallbacks", chat.fallbacks - fallbacks, Reduce.SUM)
        if len(b.token_ids) + len(close) + len(suffix) >= s.max_context:
            return ("max_turns", False) if last else ("max_context", True)
        b.add_context(close + suffix)
        if last:
            b.info["final_state_at"] = len(b.token_ids)
            return "max_turns", False
    raise AssertionError("unreachable: the loop returns on its last turn")


async def _respond(env, text: str, b: _Builder, s: _Settings) -> tuple[list[Message], bool]:
    """The answer to the model's turn: tool results if it called tools, else ``env.step``.
    Records the turn's reward; returns ``(new messages, done)``."""
    calls = s.parser.parse(text) if s.tools is not None else []
    if calls:
        results = await s.tools.execute_all(calls)
        b.info["tool_calls"] += len(results)
        b.info["tool_errors"] += sum(not r.ok for r in results)
        b.turn_rewards.append(0.0)
        new = [r.message for r in results]
        b.state = _state_key(None, new)
        return new, False
    result = as_step_result(await _env_call(env.step, text, s.step_timeout_s))
    _check_reward(result.reward)
    b.turn_rewards.append(result.reward)
    new = as_observation(result.observation, "env.step's observation")
    b.state = _state_key(result.info, new)
    return new, bool(result.done)


def _state_key(info: dict | None, messages: list[Message]) -> Any:
    """The state the next turn is taken in: ``info["state"]`` (made hashable) when the
    environment gives one, else the new messages' text."""
    if info and "state" in info:
        key = info["state"]
        try:
            hash(key)
        except TypeError:
            key = repr(key)
        return key
    return "\n".join(str(m.get("content", "")) for m in messages)


def _check_reward(reward: Any) -> None:
    ok = isinstance(reward, (int, float)) and not isinstance(reward, bool)
    if isinstance(reward, dict):
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in reward.values())
    if not ok:
        raise EnvContractError(
            f"env.step gave the reward {reward!r:.120}; a reward is a float or a dict of "
            "named floats"
        )


def _version(completion, version_of) -> int:
    return int(version_of(completion) if version_of is not None else completion.generator_version)
