"""Tool-call parsers: model text -> the calls it asks for.

A parser never raises on bad model output: a call it cannot read becomes a
:class:`ToolCallError` in its place, which the runner shows the model as a tool message (so
the policy can learn the format) and counts in metrics. Parsers are chosen by name with
:func:`build_tool_parser`; the default is Hermes (Qwen2.5/Qwen3, Hermes, many others)::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(1 + 1)"}}
    </tool_call>
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PARSERS",
    "HermesToolParser",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "build_tool_parser",
]


@dataclass
class ToolCall:
    """One well-formed call: ``name`` with keyword ``arguments``; ``raw`` is its source text."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""


@dataclass
class ToolCallError:
    """A call the parser could not read; ``message`` says why (it is shown to the model)."""

    message: str
    raw: str = ""


class ToolParser:
    """Base class: ``parse(text)`` returns the calls in ``text`` in order (empty: none)."""

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        raise NotImplementedError


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, several allowed.

    ``arguments`` may also be a JSON-encoded string of an object (some models emit that). A
    block with invalid JSON (nesting deeper than the interpreter's recursion limit and
    integers too long to convert count as invalid), no string ``name``, non-object
    ``arguments``, or an opening tag never closed becomes a ``ToolCallError``.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        # str.find, not a lazy regex: a regex retries every unclosed opening tag to the end
        # of the text, so a text of many of them is read once per tag.
        calls: list[ToolCall | ToolCallError] = []
        pos = 0
        while (start := text.find(self.open_tag, pos)) >= 0:
            body_at = start + len(self.open_tag)
            stop = text.find(self.close_tag, body_at)
            if stop < 0:
                never = f"{self.open_tag} was never closed by {self.close_tag}"
                calls.append(ToolCallError(never, text[start:]))
                break
            pos = stop + len(self.close_tag)
            calls.append(self._parse_one(text[body_at:stop], text[start:pos]))
        return calls

    @staticmethod
    def _parse_one(body: str, raw: str) -> ToolCall | ToolCallError:
        try:
            obj = _loads(body)
        except ValueError as e:
            return ToolCallError(f"the tool call is not valid JSON: {e}", raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCallError('a tool call needs a JSON object with a string "name"', raw)
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = _loads(args) if args.strip() else {}
            except ValueError as e:
                return ToolCallError(f'"arguments" is a string but not valid JSON: {e}', raw)
        if not isinstance(args, dict):
            return ToolCallError('"arguments" must be a JSON object of named arguments', raw)
        return ToolCall(obj["name"], args, raw)


def _loads(text: str) -> Any:
    """``json.loads``, with every way model text can fail it as ``ValueError``: invalid JSON
    (``JSONDecodeError``), an integer too long to convert, nesting past the interpreter's
    recursion limit."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser}


def build_tool_parser(name: str = "hermes") -> ToolParser:
    """The parser registered as ``name``; ``ValueError`` for an unknown one."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool parser type: {name!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[name]()
