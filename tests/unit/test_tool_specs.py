"""The three ways to give a tool (function, Tool object, {name, fn, schema} dict), from YAML
and from Python, and the errors for the ways that do not work."""

from __future__ import annotations

import pytest

from forge.config.schema import config_from_dict
from forge.envs import Tool, tool
from forge.envs.tool_specs import build_tools
from forge.rollout.episodes import EnvConfig

SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}


def lookup_raw(**kwargs) -> str:
    return {"a": "1", "b": "2"}.get(kwargs.get("key"), "missing")


def add(x: int, y: int) -> int:
    """Add two integers."""
    return x + y


ADD = tool(add, name="plus")


def make_add(offset: int) -> Tool:
    return tool(lambda x: x + offset, name="shift", schema={"type": "object"})


def test_every_tool_form_from_yaml_data_runs():
    data = {
        "fn": "apps.guess.task:GuessNumber",
        "tools": [
            "tests.unit.test_tool_specs:add",
            "tests.unit.test_tool_specs:ADD",
            {"fn": "tests.unit.test_tool_specs:make_add", "kwargs": {"offset": 10}},
            {
                "name": "lookup",
                "fn": "tests.unit.test_tool_specs:lookup_raw",
                "schema": SCHEMA,
                "description": "Look a key up.",
            },
            "python",
        ],
    }
    cfg = config_from_dict(EnvConfig, data)
    tools = build_tools(cfg.tools)
    assert sorted(tools.by_name) == ["add", "lookup", "plus", "python", "shift"]
    assert tools.by_name["lookup"].schema == SCHEMA
    assert tools.by_name["lookup"].description == "Look a key up."
    assert tools.by_name["add"].schema["required"] == ["x", "y"]
    calls = [("lookup", {"key": "b"}, "2"), ("add", {"x": 2, "y": 3}, 5), ("shift", {"x": 1}, 11)]
    for name, args, expected in calls:
        assert tools.by_name[name].fn(**args) == expected


def test_python_callers_pass_functions_tools_and_dicts():
    tools = build_tools([add, ADD, {"name": "lookup", "fn": lookup_raw, "schema": SCHEMA}])
    assert sorted(tools.by_name) == ["add", "lookup", "plus"]
    assert EnvConfig(fn="apps.guess.task:GuessNumber", tools=[{"fn": add}]).tools


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "x", "schema": SCHEMA}, "needs 'fn'"),
        ({"fn": lookup_raw, "params": {}}, "got keys"),
        ("tests.unit.test_tool_specs:SCHEMA", "is a dict, not a tool or function"),
        ({"fn": "tests.unit.test_tool_specs:add", "kwargs": {"x": 1, "y": 2}}, "not a Tool"),
        ("tests.unit.test_tool_specs:nope", "has no"),
    ],
)
def test_bad_tools_are_named(spec, message):
    with pytest.raises(ValueError, match=r"env\.tools\[1\]: .*" + message):
        build_tools([add, spec])
    with pytest.raises(ValueError, match="two tools are named"):
        build_tools([add, {"fn": add}])
