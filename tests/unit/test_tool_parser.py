"""Tool-call parsing, tool schemas, advertising tools in the prompt and executing calls."""

from __future__ import annotations

import asyncio

import pytest

from forge.envs import (
    HermesToolParser,
    Tool,
    ToolCall,
    ToolCallError,
    ToolSet,
    build_tool_parser,
    tool,
)
from forge.observability import get_collector, merge_states, reset_collector


def test_hermes_parses_several_calls_in_order():
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}</tool_call>'
        "done"
    )
    calls = HermesToolParser().parse(text)
    assert calls[0] == ToolCall("add", {"a": 1, "b": 2}, calls[0].raw) and calls[0].raw.startswith(
        "<tool_call>"
    )
    assert calls[1].name == "python" and calls[1].arguments == {"code": "print(3)"}
    assert len(calls) == 2


def test_hermes_no_calls_and_missing_arguments():
    parser = build_tool_parser("hermes")
    assert parser.parse("just an answer: 42") == []
    [call] = parser.parse('<tool_call>{"name": "now"}</tool_call>')
    assert call.name == "now" and call.arguments == {}


@pytest.mark.parametrize(
    "body, why",
    [
        ('{"name": "add", "arguments": {"a": 1,}}', "not valid JSON"),
        ('["add", {"a": 1}]', 'string "name"'),
        ('{"name": 3}', 'string "name"'),
        ('{"name": "add", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "add", "arguments": "{oops"}', "string but not valid JSON"),
    ],
)
def test_hermes_malformed_calls_become_errors(body, why):
    calls = HermesToolParser().parse(f"ok <tool_call>{body}</tool_call> then")
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError)
    assert why in calls[0].message and body in calls[0].raw


def test_hermes_unclosed_call_after_a_good_one():
    text = '<tool_call>{"name": "a"}</tool_call> and <tool_call>{"name": "b", "argu'
    good, bad = HermesToolParser().parse(text)
    assert good.name == "a"
    assert isinstance(bad, ToolCallError) and "never closed" in bad.message
    assert bad.raw.startswith('<tool_call>{"name": "b"')


def test_unknown_parser_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown tool parser type: 'xml'; choose one of"):
        build_tool_parser("xml")


def test_tool_schema_inferred_from_hints():
    @tool
    def search(query: str, k: int = 3, exact: bool = False, weights: list[float] = ()) -> str:
        """Search the index.

        Longer text that is not part of the description."""
        return query

    assert isinstance(search, Tool) and search.name == "search"
    assert search.description == "Search the index."
    assert search.schema == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "k": {"type": "integer"},
            "exact": {"type": "boolean"},
            "weights": {"type": "array"},
        },
        "required": ["query"],
    }
    spec = search.spec()
    assert spec["type"] == "function" and spec["function"]["name"] == "search"

    named = tool(name="lookup", timeout_s=1.0)(lambda key: key)
    assert named.name == "lookup" and named.schema["properties"] == {"key": {"type": "string"}}

    class Point:
        pass

    def move(p: Point) -> None: ...

    with pytest.raises(TypeError, match=r"parameter 'p'.*schema="):
        tool(move)
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        ToolSet([named, named])


class _Tok:
    def __init__(self, template: str) -> None:
        self.chat_template = template


def test_prepare_uses_template_tools_or_a_system_message():
    tools = ToolSet([tool(lambda a: a, name="echo")])
    msgs = [{"role": "user", "content": "hi"}]
    # A template that renders `tools` gets them as a keyword.
    same, kwargs = tools.prepare(msgs, _Tok("{% if tools %}{{ tools }}{% endif %}"))
    assert same == msgs and kwargs == {"tools": tools.specs()}
    # One that ignores them (like the tiny ChatML template) gets a Hermes system message.
    from forge.models.tiny import CHAT_TEMPLATE

    assert "tools" not in CHAT_TEMPLATE
    out, kwargs = tools.prepare(msgs, _Tok(CHAT_TEMPLATE))
    assert kwargs == {} and out[1:] == msgs and out[0]["role"] == "system"
    assert "<tools>" in out[0]["content"] and '"name": "echo"' in out[0]["content"]
    assert "<tool_call>" in out[0]["content"]
    # An existing system message is extended, not duplicated.
    out, _ = tools.prepare([{"role": "system", "content": "Be brief."}, *msgs], _Tok("x"))
    assert len(out) == 2 and out[0]["content"].startswith("Be brief.\n\n# Tools")


async def test_execute_results_errors_timeouts_and_metrics():
    reset_collector()

    @tool
    def add(a: int, b: int) -> int:
        return a + b

    @tool
    def boom() -> str:
        raise RuntimeError("kaput")

    @tool(timeout_s=0.1)
    async def slow() -> str:
        await asyncio.sleep(5)
        return "never"

    @tool
    def long() -> str:
        return "x" * 70

    tools = ToolSet([add, boom, slow, long], max_output_chars=30)
    calls = HermesToolParser().parse(
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "boom", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}</tool_call>'
        '<tool_call>{"name": "long", "arguments": {}}</tool_call>'
        "<tool_call>{bad json</tool_call>"
    )
    results = await tools.execute_all(calls)
    msgs = [r.message for r in results]
    assert all(m["role"] == "tool" for m in msgs)
    assert msgs[0] == {"role": "tool", "content": "5", "name": "add"} and results[0].ok
    assert msgs[1]["content"] == "Error: RuntimeError: kaput"
    assert "timed out after 0.1 s" in msgs[2]["content"]
    assert "unknown tool 'nope'; available: add, boom, long, slow" in msgs[3]["content"]
    assert "missing required argument(s) ['b']" in msgs[4]["content"]
    assert "unknown argument(s) ['c']" in msgs[5]["content"]
    assert msgs[6]["content"].startswith("x" * 30 + "\n... [truncated 40 characters]")
    assert results[6].ok and "malformed tool call" in msgs[7]["content"]
    errors = [r.error for r in results]
    assert errors == [
        "",
        "exception",
        "timeout",
        "unknown_tool",
        "bad_arguments",
        "bad_arguments",
        "",
        "parse",
    ]
    metrics = merge_states([get_collector().flush()])
    assert metrics["env/tool_calls"] == 8 and metrics["env/tool_errors"] == 6
    assert metrics["env/tool_timeouts"] == 1 and metrics["env/tool_parse_errors"] == 1
