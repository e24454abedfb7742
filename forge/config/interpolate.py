"""``${...}`` interpolation over a parsed YAML tree (nested dicts and lists).

Forms, all inside ``${...}``:

- ``${trainer.lr}``: the value at an absolute dotted path (list items by index: ``${a.0}``).
  The referenced value is itself resolved first; a cycle is an error naming the chain.
- ``${env:VAR}`` and ``${env:VAR,default}``: an environment variable (read through
  :mod:`forge.settings`). Numbers and ``true``/``false`` are decoded, anything else stays text.
- ``${max_prompt_len + max_response_len}``, ``${a.b * 2}``, ``${(a - 1) // 2}``: arithmetic
  with ``+ - * / // %``, unary minus and parentheses over numbers and key references. It is
  evaluated by walking the ``ast`` of the expression, never with ``eval``.

A string that is exactly one ``${...}`` takes the value's own type (an int stays an int, a
mapping stays a mapping); one embedded in longer text is stringified into it. Interpolations
may nest (``${env:OUT,${run.dir}}``); the innermost is resolved first.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

from forge.config.yaml_io import parse_scalar
from forge.settings import get_env_var

__all__ = ["resolve_interpolations"]

# Innermost interpolation: no "$", "{" or "}" between the braces.
_INTERP_RE = re.compile(r"\$\{([^${}]*)\}")
_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*(?:\.[\w-]+)*$")
_MAX_PASSES = 64

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARYOPS: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def resolve_interpolations(tree: dict[str, Any], *, source: str = "<config>") -> dict[str, Any]:
    """Return a copy of ``tree`` with every ``${...}`` resolved.

    ``source`` (usually the YAML file's path) prefixes every error message. Raises
    ``ValueError`` for a missing key, an unset environment variable without default, a cycle,
    or an unsupported expression.
    """
    return _Resolver(tree, source).node("")


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Resolver:
    """Resolves paths on demand, memoising results and tracking the chain for cycles."""

    def __init__(self, root: dict[str, Any], source: str) -> None:
        self.root = root
        self.source = source
        self.done: dict[str, Any] = {}
        self.chain: list[str] = []

    def error(self, path: str, message: str) -> ValueError:
        where = f"key {path!r}" if path else "top level"
        return ValueError(f"{self.source}: {where}: {message}")

    def lookup(self, path: str) -> tuple[bool, Any]:
        """The raw (unresolved) value at ``path``, as ``(found, value)``."""
        node: Any = self.root
        for part in path.split(".") if path else []:
            if isinstance(node, dict):
                matches = [k for k in node if str(k) == part]
                if not matches:
                    return False, None
                node = node[matches[0]]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False, None
        return True, node

    def node(self, path: str) -> Any:
        """The fully resolved value at ``path``."""
        if path in self.done:
            return self.done[path]
        if path in self.chain:
            cycle = " -> ".join([*self.chain[self.chain.index(path) :], path])
            raise ValueError(f"{self.source}: interpolation cycle: {cycle}")
        _, raw = self.lookup(path)
        self.chain.append(path)
        try:
            if isinstance(raw, dict):
                value: Any = {k: self.node(_join(path, k)) for k in raw}
            elif isinstance(raw, list):
                value = [self.node(_join(path, i)) for i in range(len(raw))]
            elif isinstance(raw, str) and "${" in raw:
                value = self.string(raw, path)
            else:
                value = raw
        finally:
            self.chain.pop()
        self.done[path] = value
        return value

    def string(self, text: str, path: str) -> Any:
        """Resolve the interpolations in one string value, innermost first."""
        value: Any = text
        for _ in range(_MAX_PASSES):
            if not isinstance(value, str) or "${" not in value:
                return value
            whole = _INTERP_RE.fullmatch(value)
            if whole:
                value = self.evaluate(whole.group(1), path)
                continue
            if not _INTERP_RE.search(value):
                raise self.error(path, f"unbalanced '${{' in {text!r}")
            value = _INTERP_RE.sub(lambda m: self.embed(m.group(1), path, text), value)
        raise self.error(
            path, f"interpolation of {text!r} did not settle after {_MAX_PASSES} passes"
        )

    def embed(self, expr: str, path: str, text: str) -> str:
        value = self.evaluate(expr, path)
        if isinstance(value, (dict, list)):
            raise self.error(
                path, f"${{{expr}}} is a {type(value).__name__} and cannot be embedded in {text!r}"
            )
        return _to_text(value)

    def evaluate(self, expr: str, path: str) -> Any:
        """The value of the text between ``${`` and ``}``."""
        expr = expr.strip()
        if expr.startswith("env:"):
            return self.env_var(expr[len("env:") :], path)
        if _KEY_RE.match(expr) and self.lookup(expr)[0]:
            return self.node(expr)
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            raise self.error(path, f"cannot parse interpolation ${{{expr}}}") from None
        return self.arith(tree.body, expr, path)

    def env_var(self, spec: str, path: str) -> Any:
        name, has_default, default = (part.strip() for part in spec.partition(","))
        value = get_env_var(name)
        if value is None:
            if not has_default:
                raise self.error(
                    path,
                    f"environment variable {name!r} is not set and ${{env:{spec}}} has no default",
                )
            value = default
        try:
            decoded = parse_scalar(value)
        except Exception:  # any YAML error just means "not a scalar": keep the text
            return value
        return decoded if _is_number(decoded) or isinstance(decoded, bool) else value

    def arith(self, node: ast.AST, expr: str, path: str) -> Any:
        """Evaluate an arithmetic ``ast`` node over numbers and key references."""
        if isinstance(node, ast.Constant) and _is_number(node.value):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            ref = _dotted_name(node)
            if ref is None:
                raise self.error(path, f"unsupported reference in ${{{expr}}}")
            found, _ = self.lookup(ref)
            if not found:
                raise self.error(path, f"${{{expr}}} refers to missing key {ref!r}")
            value = self.node(ref)
            if not _is_number(value):
                raise self.error(
                    path, f"${{{expr}}} uses {ref!r} = {value!r}, which is not a number"
                )
            return value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left = self.arith(node.left, expr, path)
            right = self.arith(node.right, expr, path)
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise self.error(path, f"division by zero in ${{{expr}}}") from None
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARYOPS:
            return _UNARYOPS[type(node.op)](self.arith(node.operand, expr, path))
        raise self.error(
            path,
            f"unsupported expression ${{{expr}}}; only numbers, key references, "
            "+ - * / // % and parentheses are allowed",
        )


def _dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for ``Attribute(Attribute(Name(a), b), c)``; ``None`` for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))
