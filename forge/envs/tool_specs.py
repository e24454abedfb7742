"""Tools named in a config: the three ways to give one, and ``build_tools``.

``env.tools`` takes, per tool, any of::

    python                                          # the sandboxed Python tool (kwargs: limits)
    mypkg.tools:lookup                              # a plain function (schema from type hints)
    mypkg.tools:LOOKUP                              # a forge.envs.Tool object
    {fn: mypkg.tools:make_lookup, kwargs: {...}}    # a factory of a Tool, with its arguments
    {name: lookup, fn: mypkg.tools:lookup_raw,      # a function with its own name, schema,
     schema: {type: object, ...}, description: ...} #   description and timeout

Python callers may also pass the function, the ``Tool`` or the dict itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forge.envs.sandbox import python_tool
from forge.envs.tools import Tool, ToolSet, tool
from forge.plugins import PluginSpec, import_string

__all__ = ["ToolSpec", "build_tools"]


@dataclass
class ToolSpec:
    """One tool in a config: ``fn`` (an import string or, from Python, a callable) and
    either ``kwargs`` (``fn`` is a factory returning a ``Tool``, or ``python``'s limits) or
    the tool's own ``name``, JSON ``schema`` of its arguments, ``description`` and
    ``timeout_s`` (defaults: the function's name, type hints and docstring)."""

    fn: Any
    """An import string (from Python, a callable): a plain function, a ``Tool``, a factory
    returning one, or ``python``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments of a factory ``fn`` (or ``python``'s limits)."""
    name: str = ""
    """The tool's name (default: the function's)."""
    schema: dict[str, Any] | None = None
    """The JSON schema of its arguments (default: from the type hints)."""
    description: str | None = None
    """What the model is told it does (default: the docstring)."""
    timeout_s: float | None = None
    """The bound on one call."""


def build_tools(specs: list[Any], advertise: bool = True) -> ToolSet | None:
    """A ToolSet from tool specs (see the module docstring); ``None`` when there are none.
    ``ValueError`` naming ``env.tools[i]`` for a spec that does not make a tool."""
    if not specs:
        return None
    tools = []
    for i, spec in enumerate(specs):
        try:
            tools.append(_tool(spec))
        except (ValueError, TypeError) as e:
            raise ValueError(f"env.tools[{i}]: {e}") from None
    try:
        return ToolSet(tools, advertise=advertise)
    except ValueError as e:
        raise ValueError(f"env.tools: {e}") from None


def _tool(spec: Any) -> Tool:
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(ToolSpec.__dataclass_fields__))
        if unknown or "fn" not in spec:
            raise ValueError(
                f"a tool dict needs 'fn' and may have {sorted(ToolSpec.__dataclass_fields__)}; "
                f"got keys {sorted(spec)}"
            )
        spec = ToolSpec(**spec)
    if isinstance(spec, PluginSpec):
        spec = ToolSpec(spec.fn, dict(spec.kwargs))
    if not isinstance(spec, ToolSpec):
        spec = ToolSpec(spec)
    if spec.fn == "python":  # the sandboxed Python tool, kwargs for its limits
        return python_tool(**spec.kwargs)
    obj = import_string(spec.fn) if isinstance(spec.fn, str) else spec.fn
    own = {
        "name": spec.name or None,
        "schema": spec.schema,
        "description": spec.description,
        "timeout_s": spec.timeout_s,
    }
    if isinstance(obj, Tool):
        return obj
    if spec.kwargs:  # a factory of a Tool, given its arguments
        made = obj(**spec.kwargs)
        if not isinstance(made, Tool):
            raise TypeError(
                f"{spec.fn!r}(**{spec.kwargs}) made a {type(made).__name__}, not a Tool"
            )
        return made
    if callable(obj):  # a plain function: its own settings, else its type hints
        return tool(obj, **own)
    raise TypeError(f"{spec.fn!r} is a {type(obj).__name__}, not a tool or function")
