"""Forge as the agent of a verifiers (0.4.0, ``verifiers.v1``) environment.

verifiers runs an episode push-style: ``env.run(task, agents)`` drives its agents, each model
turn is a harness program calling a model endpoint, and verifiers' ``Rollout`` keeps a
``vf.Trace`` of the conversation, applies the limits (``max_turns``) and ``@vf.stop``
predicates before each model call and scores the trace with the task's ``@vf.reward``
functions when the rollout closes. Forge runs an episode pull-style (``reset``/``step``,
token-in/token-out in ``forge.envs.run_episode``). This module joins the two: the env's
``run`` executes in a background task against :class:`BridgeAgents`, whose policy role asks
Forge (through a :class:`Channel`) for each model turn instead of calling a harness, and
records it on a real ``vf.Trace`` with the package's own session, graph and scoring code.

Tools: a task's ``vf.Toolset`` classes run in-process (their ``@vf.tool`` methods, sharing
the trace's ``state`` as verifiers' state channel would); the model writes calls as text in
the Hermes format (``<tool_call>{...}</tool_call>``, what Forge's runner samples), which
become OpenAI ``tool_calls`` on the trace, as a serving engine's tool parser would make them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from forge.envs.tool_parser import HermesToolParser
from forge.envs.tools import Tool, ToolSet, tool

__all__ = ["BridgeAgents", "Channel", "to_forge"]


class Channel:
    """The hand-over between the env's background task and Forge's ``reset``/``step``.

    The env side calls ``ask(messages)`` (the messages Forge has not seen yet) and gets the
    model's next turn; ``finish(result)`` / ``fail(error)`` end the episode. Forge's side
    reads ``next_event()`` and answers an ``ask`` with ``answer(text)``."""

    def __init__(self) -> None:
        self.events: asyncio.Queue = asyncio.Queue()
        self.actions: asyncio.Queue = asyncio.Queue()

    async def ask(self, messages: list[dict]) -> str:
        await self.events.put(("ask", messages))
        return await self.actions.get()

    async def next_event(self) -> tuple[str, Any]:
        return await self.events.get()

    async def answer(self, text: str) -> None:
        await self.actions.put(text)


def to_forge(message: Any) -> dict:
    """A ``vf`` message as a Forge chat message (text content)."""
    from verifiers.v1.types import content_text

    out = {"role": message.role, "content": content_text(message.content) or ""}
    if getattr(message, "name", None):
        out["name"] = message.name
    return out


class BridgeAgents:
    """``Agents`` for ``env.run``: the role ``policy`` is Forge's model; every other role
    would need a model of its own, which Forge does not serve (an error names it)."""

    def __init__(self, env: Any, policy: str, channel: Channel, completed: list) -> None:
        from verifiers.v1.configs.agent import agent_config_fields

        roles = agent_config_fields(env.config)
        if policy not in roles:
            raise ValueError(
                f"verifiers env {type(env).__name__} has no role {policy!r}; its roles are "
                f"{sorted(roles)} (set kwargs.role to the one the policy plays)"
            )
        self._roles, self._policy = roles, policy
        self._agent = BridgeAgent(policy, roles[policy], channel, completed, env.taskset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == self._policy:
            return self._agent
        if name in self._roles:
            raise NotImplementedError(
                f"the verifiers env drives role {name!r}, which needs a model of its own; "
                f"Forge plays only the policy role {self._policy!r} (multi-agent envs such "
                "as user-sim cannot train through Forge yet)"
            )
        raise AttributeError(f"no agent {name!r}; this env declares {sorted(self._roles)}")


class BridgeAgent:
    """One role played by Forge's policy: ``run(task)`` (one segment: the model answers,
    calling tools until it replies without a call) and ``interaction(task)``."""

    def __init__(
        self, name: str, config: Any, channel: Channel, completed: list, taskset: Any
    ) -> None:
        from verifiers.v1.session import RolloutLimits

        extra = [
            k
            for k in ("max_input_tokens", "max_output_tokens", "max_total_tokens")
            if getattr(config, k) is not None
        ]
        if extra:
            raise ValueError(
                f"verifiers agent limits {extra} count tokens from a serving engine's usage, "
                "which Forge does not report; bound the episode with env.max_context_tokens"
            )
        self.name, self.config, self.channel = name, config, channel
        self.completed = completed
        self.taskset, self.trainable = taskset, True
        self.limits = RolloutLimits(max_turns=config.max_turns)

    async def run(self, task: Any, **_: Any) -> Any:
        async with self.interaction(task, _closing="agent_completed") as interaction:
            await interaction.turn()
        return interaction.trace

    @asynccontextmanager
    async def interaction(self, task: Any, *, _closing: str = "user_closed", **_: Any):
        rollout = BridgeRollout(task, self, self.taskset)
        try:
            yield rollout
        finally:
            await rollout.close(_closing)
            self.completed.append(rollout.trace)


class BridgeRollout:
    """What ``Agent.interaction`` yields (``turn``, ``trace``), on a real ``vf.Trace``: the
    rollout's limits, ``@vf.stop`` predicates and request/response hooks run through
    verifiers' ``RolloutSession``; turns are committed to the trace graph; ``close`` scores
    the trace with ``task.score`` (runtime-free signals; no harness metrics)."""

    def __init__(self, task: Any, agent: BridgeAgent, taskset: Any) -> None:
        from verifiers.v1.session import RolloutSession, hook_boundary
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.utils.decorators import discover_decorated

        if getattr(task, "NEEDS_CONTAINER", False):
            raise NotImplementedError(
                f"task {type(task).__name__} needs a container runtime; Forge runs "
                "verifiers tasks in-process without one"
            )
        self.task, self.agent = task, agent
        self.trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=agent.config, name=agent.name, trainable=agent.trainable),
        )
        intercepts = [
            (hook_boundary(f, allow_trace=False), f) for f in discover_decorated(task, "intercept")
        ]
        stops = [(hook_boundary(f, allow_trace=True), f) for f in task.hooks("stop")]
        from verifiers.v1.types import Request, Response

        def of(pairs, kind):
            return [f for b, f in pairs if b is kind]

        self.session = RolloutSession(
            ctx=None,
            trace=self.trace,
            limits=agent.limits,
            trace_stops=of(stops, Trace),
            request_stops=of(stops, Request),
            response_stops=of(stops, Response),
            request_interceptors=of(intercepts, Request),
            response_interceptors=of(intercepts, Response),
            gates_tools=True,
        )
        self.tools, self.specs = _task_tools(task, taskset, self.trace.state)
        self.messages: list = _opening(task.data, self.specs)
        self.shown = 0  # how many of self.messages Forge has seen
        self.parser, self.started, self.over = HermesToolParser(), False, False

    async def turn(self, message: Any = None) -> Any:
        """One user turn (``None``: the prompted task's opening) and one segment."""
        from verifiers.v1.agent import Segment
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.types import UserMessage

        if self.over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if isinstance(message, str):
            self.messages.append(UserMessage(content=message))
        elif message is not None:
            self.messages += [parse_message(m) if isinstance(m, dict) else m for m in message]
        self.started = True
        produced = await self._segment()
        if produced is None:
            self.over = True
            return Segment(messages=[], terminated=True)
        return Segment(messages=produced)

    async def _segment(self) -> list | None:
        """Model turns until one calls no tool; ``None`` when a limit or stop refused."""
        from verifiers.v1 import graph
        from verifiers.v1.types import Request

        produced: list = []
        while True:
            if await self.session.refused() is not None:
                return None
            request, _, stopped = await self.session.rewrite_request(
                Request(messages=list(self.messages), tools=self.specs or None)
            )
            self.messages = list(request.messages)
            if stopped is not None:
                graph.prepare_turn(self.trace, self.messages, self.specs).commit_prompt()
                self.trace.stop(stopped)
                return None
            new = [to_forge(m) for m in self.messages[self.shown :]]
            text = await self.agent.channel.ask(new)
            response, calls = self._response(text)
            response, _, stopped = await self.session.rewrite_response(response)
            graph.prepare_turn(self.trace, self.messages, self.specs).commit(response)
            self.messages.append(response.message)
            self.shown = len(self.messages)
            produced.append(response.message)
            if stopped is not None:
                self.trace.stop(stopped)
                return produced
            if not calls:
                return produced
            results = await self._run_tools(calls, response.message.tool_calls)
            self.messages += results
            produced += results

    def _response(self, text: str) -> tuple[Any, list]:
        import json

        from verifiers.v1.types import AssistantMessage, Response, ToolCall

        calls = self.parser.parse(text) if self.tools is not None else []
        tool_calls = [
            ToolCall(
                id=f"call_{uuid.uuid4().hex[:8]}",
                name=getattr(c, "name", "") or "error",
                arguments=json.dumps(getattr(c, "arguments", {})),
            )
            for c in calls
        ] or None
        message = AssistantMessage(content=text, tool_calls=tool_calls)
        response = Response(
            id=uuid.uuid4().hex,
            created=int(time.time()),
            model="forge",
            message=message,
            finish_reason="tool_calls" if calls else "stop",
        )
        return response, calls

    async def _run_tools(self, calls: list, tool_calls: list) -> list:
        from verifiers.v1.types import ToolMessage

        results = await self.tools.execute_all(calls)
        return [
            ToolMessage(
                tool_call_id=tc.id, content=r.message["content"], name=r.message.get("name")
            )
            for tc, r in zip(tool_calls, results)
        ]

    async def close(self, condition: str) -> None:
        """End the exchange and score the trace (verifiers' ``task.score``)."""
        if self.trace.stop_condition is None:
            self.trace.stop(condition)
        await self.task.score(self.trace)
        self.trace.is_completed, self.trace.ok = True, True


def _opening(data: Any, specs: list) -> list:
    """The conversation before the first model turn, as verifiers' chat harness builds it:
    the system prompt as a system message (plus the tool listing, in the Hermes format
    Forge's models read), then the prompt (a string is one user message)."""
    from verifiers.v1.types import SystemMessage, UserMessage

    from forge.envs.tools import tools_system_prompt

    system = data.system_prompt
    if specs:
        listing = tools_system_prompt(
            [
                {
                    "type": "function",
                    "function": {
                        "name": s.name,
                        "description": s.description,
                        "parameters": s.parameters,
                    },
                }
                for s in specs
            ]
        )
        system = f"{system}\n\n{listing}" if system else listing
    messages: list = [SystemMessage(content=system)] if system else []
    if isinstance(data.prompt, str):
        messages.append(UserMessage(content=data.prompt))
    elif data.prompt is not None:
        messages += list(data.prompt)
    return messages


def _task_tools(task: Any, taskset: Any, state: Any) -> tuple[ToolSet | None, list]:
    """The task's and taskset's ``vf.Toolset`` tools, in-process: a Forge ``ToolSet`` that
    executes them, and their ``vf.Tool`` specs for the trace."""
    from verifiers.v1.types import Tool as VfTool
    from verifiers.v1.utils.decorators import discover_decorated

    servers = [*task.toolsets(task.config), *type(taskset).toolsets(taskset.config)]
    tools: list[Tool] = []
    for server in servers:
        prefix = server.server_name
        for fn in discover_decorated(server, "tool"):
            name = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{prefix}_{name}" if prefix else name
            described = tool(fn, name=name, description=(fn.__doc__ or "").strip())
            tools.append(
                Tool(name, _with_state(fn, state), described.schema, described.description)
            )
    if not tools:
        return None, []
    specs = [VfTool(name=t.name, description=t.description, parameters=t.schema) for t in tools]
    return ToolSet(tools, advertise=False), specs


def _with_state(fn: Any, state: Any) -> Any:
    """``fn`` seeing the rollout's ``state`` as ``self.state``, as the state channel would
    sync it between a tool server and the host."""
    from verifiers.v1.mcp import server as mcp_server

    async def call(**kwargs: Any) -> Any:
        token = mcp_server._call_state.set(state)
        try:
            result = fn(**kwargs)
            return await result if inspect.isawaitable(result) else result
        finally:
            mcp_server._call_state.reset(token)

    return call
