"""Tools: plain Python callables with a name and a JSON schema, and the set a model may call.

::

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b

    tools = ToolSet([add, python_tool()])
    messages, template_kwargs = tools.prepare(messages, tokenizer)   # advertise the tools
    results = await tools.execute_all(HermesToolParser().parse(model_text))

Advertising: a chat template that uses ``tools`` (Qwen2.5/3, Llama 3.1, ...) gets them as
``apply_chat_template(..., tools=schemas)``. One that ignores them (the tiny test model's
ChatML template) gets a system message listing them in the Hermes/Qwen format instead.
``ToolSet(..., advertise=False)`` adds nothing to the prompt: for a model that learned its
tools in training and whose context cannot hold the listing.

Execution never raises: an unknown tool, bad arguments, an exception in the tool, a timeout
or an unparsable call become a ``role: "tool"`` message saying what went wrong, which the
model sees, and are counted (``env/tool_calls``, ``env/tool_errors``, ``env/tool_timeouts``,
``env/tool_parse_errors``, summed per step).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from forge.envs.environment import call_env
from forge.envs.messages import Message
from forge.envs.tool_parser import ToolCall, ToolCallError
from forge.observability import Reduce, record_metric

__all__ = ["Tool", "ToolResult", "ToolSet", "tool", "tools_system_prompt"]

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


@dataclass
class Tool:
    """A callable the model may call by ``name``; ``schema`` is the JSON schema of its
    keyword arguments (``{"type": "object", "properties": ..., "required": [...]}``).
    ``timeout_s`` bounds one call (``None``: no bound; sync tools run in a thread)."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    description: str = ""
    timeout_s: float | None = None

    def spec(self) -> dict[str, Any]:
        """The OpenAI/HF function spec that chat templates take in ``tools=[...]``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            },
        }


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Type hints of ``fn``; unresolvable string annotations map by their base name."""
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError):
        by_name = {t.__name__: t for t in _JSON_TYPES}
        raw = getattr(fn, "__annotations__", {})
        return {
            k: by_name.get(v.split("[")[0].strip(), v) if isinstance(v, str) else v
            for k, v in raw.items()
        }


def _schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    hints = _hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {fn.__name__!r}: *args/**kwargs have no schema; pass schema=... to tool()"
            )
        hint = hints.get(name, str)
        base = typing.get_origin(hint) or hint
        if base not in _JSON_TYPES:
            raise TypeError(
                f"tool {fn.__name__!r}: cannot infer a JSON type for parameter {name!r} "
                f"({hint!r}); use str/int/float/bool/list/dict or pass schema=... to tool()"
            )
        properties[name] = {"type": _JSON_TYPES[base]}
        if param.default is param.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Make a :class:`Tool` of ``fn`` (as ``@tool`` or ``@tool(name=..., timeout_s=...)``).

    The schema is inferred from the type hints (str/int/float/bool/list/dict; parameters
    without a default are required) unless ``schema`` is given; the description defaults
    to the docstring's first paragraph.
    """

    def make(f: Callable[..., Any]) -> Tool:
        doc = inspect.getdoc(f) or ""
        return Tool(
            name=name or f.__name__,
            fn=f,
            schema=schema if schema is not None else _schema_of(f),
            description=description if description is not None else doc.split("\n\n")[0],
            timeout_s=timeout_s,
        )

    return make if fn is None else make(fn)


def tools_system_prompt(specs: list[dict[str, Any]]) -> str:
    """The Hermes/Qwen system-prompt block that lists ``specs`` and the call format."""
    listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in specs)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def template_supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", "") + template.get("tool_use", "")
    return "tools" in template


@dataclass
class ToolResult:
    """What executing one call gave: the tool message and how it went."""

    message: Message
    ok: bool
    error: str = ""  # "", "parse", "unknown_tool", "bad_arguments", "timeout", "exception"


@dataclass
class ToolSet:
    """The tools of an environment, by name. ``max_output_chars`` truncates tool output;
    ``advertise=False`` keeps ``prepare`` from listing the tools in the prompt."""

    tools: Iterable[Tool | Callable[..., Any]] = ()
    max_output_chars: int = 4000
    advertise: bool = True
    by_name: dict[str, Tool] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for t in self.tools:
            t = t if isinstance(t, Tool) else tool(t)
            if t.name in self.by_name:
                raise ValueError(f"two tools are named {t.name!r}; tool names must be unique")
            self.by_name[t.name] = t
        self.tools = list(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def specs(self) -> list[dict[str, Any]]:
        """The function specs of every tool (``tools=`` of ``apply_chat_template``)."""
        return [t.spec() for t in self.by_name.values()]

    def prepare(self, messages: list[Message], tokenizer) -> tuple[list[Message], dict]:
        """``(messages, template_kwargs)`` that advertise the tools to the model.

        Templates that render ``tools`` get ``{"tools": specs}``; otherwise the tool listing
        goes into the system message (prepended, or appended to an existing one). With
        ``advertise=False`` the messages come back unchanged.
        """
        if not self.advertise:
            return list(messages), {}
        if template_supports_tools(tokenizer):
            return list(messages), {"tools": self.specs()}
        block = tools_system_prompt(self.specs())
        if messages and messages[0].get("role") == "system":
            first = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
            return [first, *messages[1:]], {}
        return [{"role": "system", "content": block}, *messages], {}

    async def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        """Run one parsed call; every failure becomes a tool message (never raises)."""
        if isinstance(call, ToolCallError):
            return self._error("", f"Error: malformed tool call: {call.message}", "parse")
        t = self.by_name.get(call.name)
        if t is None:
            known = ", ".join(sorted(self.by_name)) or "none"
            return self._error(
                call.name, f"Error: unknown tool {call.name!r}; available: {known}", "unknown_tool"
            )
        problem = _check_arguments(t, call.arguments)
        if problem:
            return self._error(t.name, f"Error: {problem}", "bad_arguments")
        try:
            value = await asyncio.wait_for(_invoke(t, call.arguments), t.timeout_s)
        except asyncio.TimeoutError:
            return self._error(t.name, f"Error: tool timed out after {t.timeout_s} s", "timeout")
        except Exception as e:  # noqa: BLE001 - the model sees the error, the episode goes on
            detail = str(e)[: self.max_output_chars]
            return self._error(t.name, f"Error: {type(e).__name__}: {detail}", "exception")
        return ToolResult(self._message(t.name, _to_text(value)), ok=True)

    async def execute_all(self, calls: list[ToolCall | ToolCallError]) -> list[ToolResult]:
        """Run ``calls`` one after another (a turn's calls may depend on each other's
        effects) and record the ``env/tool_*`` metrics."""
        results = [await self.execute(c) for c in calls]
        record_metric("env/tool_calls", len(results), Reduce.SUM)
        record_metric("env/tool_errors", sum(not r.ok for r in results), Reduce.SUM)
        record_metric("env/tool_timeouts", sum(r.error == "timeout" for r in results), Reduce.SUM)
        parse_errors = sum(r.error == "parse" for r in results)
        record_metric("env/tool_parse_errors", parse_errors, Reduce.SUM)
        return results

    def _message(self, name: str, text: str, truncate: bool = True) -> Message:
        if truncate and len(text) > self.max_output_chars:
            cut = len(text) - self.max_output_chars
            text = f"{text[: self.max_output_chars]}\n... [truncated {cut} characters]"
        message: Message = {"role": "tool", "content": text}
        if name:
            message["name"] = name
        return message

    def _error(self, name: str, text: str, kind: str) -> ToolResult:
        return ToolResult(self._message(name, text, truncate=False), ok=False, error=kind)


async def _invoke(t: Tool, arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(t.fn):
        return await t.fn(**arguments)
    return await call_env(lambda: t.fn(**arguments))


def _check_arguments(t: Tool, arguments: dict[str, Any]) -> str:
    """Why ``arguments`` do not fit ``t.schema`` (missing or unknown names), or ``""``."""
    properties = t.schema.get("properties", {})
    missing = [n for n in t.schema.get("required", []) if n not in arguments]
    unknown = [n for n in arguments if properties and n not in properties]
    if missing:
        return f"tool {t.name!r} is missing required argument(s) {missing}"
    if unknown:
        return f"tool {t.name!r} got unknown argument(s) {unknown}; it takes {list(properties)}"
    return ""


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if hasattr(value, "to_text"):
        return value.to_text()
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
