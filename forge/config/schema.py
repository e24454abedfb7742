"""Turn plain data (from YAML) into typed, nested config dataclasses, and back.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``X | None`` / ``Optional[X]``,
other unions (first type that fits wins), ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``,
``Literal[...]``, ``Any``, ``Enum`` and ``pathlib.Path`` subclasses, and nested dataclasses.

Two hooks a dataclass may define: ``__config_prepare__(cls, data) -> data`` (a classmethod)
rewrites its section's plain data before conversion, so a fact stated once flows into the
parts that need it (``forge.run.policy``); ``__config_schema__(cls, data) -> type`` (a
classmethod) names the dataclass to build from the data (``forge.run.pipeline.Stage``: a
section whose ``app`` key picks its schema).

The checks are strict on purpose, since a config typo should fail before any process
starts: a bool is not an int, a string is not a number, a number is not a string, and an int
is accepted for a float (and converted). Every problem is collected, then reported together
in one ``ValueError`` that names the source file, each full dotted key and the bad value.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Literal, TypeVar, Union

__all__ = ["config_from_dict", "config_to_dict"]

T = TypeVar("T")
_INVALID = object()  # sentinel: conversion failed and an error was recorded


def config_from_dict(
    schema: type[T],
    data: Mapping[str, Any],
    *,
    source: str = "<dict>",
    origins: Mapping[str, str] | None = None,
) -> T:
    """Build a ``schema`` dataclass instance from nested plain data.

    ``source`` names where the data came from (a file path) in error messages; ``origins``
    maps dotted keys to the command-line override that set them, so an error can point there.
    Raises ``ValueError`` listing every problem found.
    """
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"schema must be a dataclass type, got {schema!r}")
    conv = _Converter(origins or {})
    result = conv.convert(schema, data, "")
    if conv.errors:
        lines = "\n".join(f"  - {e}" for e in conv.errors)
        n = len(conv.errors)
        raise ValueError(f"invalid config {source} ({n} error{'s' * (n > 1)}):\n{lines}")
    return result


def config_to_dict(cfg: Any) -> Any:
    """Plain nested dicts/lists/scalars for a config dataclass (or any value inside one).

    Tuples become lists, enums their values, paths strings and callables (given to extension
    points from Python) their ``module:qualname`` import strings, so the result dumps to YAML
    and loads back into an equal config.
    """
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, PurePath):
        return str(cfg)
    if callable(cfg):  # a callable given to an extension point: its import string
        from forge.plugins import describe

        return config_to_dict(describe(cfg))
    return cfg


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


class _Converter:
    def __init__(self, origins: Mapping[str, str]) -> None:
        self.origins = origins
        self.errors: list[str] = []

    def fail(self, key: str, message: str) -> object:
        origin = self.origins.get(key)
        suffix = f" (set by override {origin!r})" if origin else ""
        self.errors.append(f"{key or '<top level>'}: {message}{suffix}")
        return _INVALID

    def mismatch(self, key: str, expected: str, value: Any) -> object:
        hint = ""
        if expected == "str" and isinstance(value, (int, float, bool)):
            hint = "; quote it in YAML to make it a string"
        elif isinstance(value, str) and expected in ("int", "float"):
            hint = "; write the number without quotes"
        return self.fail(key, f"expected {expected}, got {value!r} ({type(value).__name__}){hint}")

    def convert(self, tp: Any, value: Any, key: str) -> Any:
        """``value`` converted to type ``tp``, or ``_INVALID`` after recording an error."""
        origin = typing.get_origin(tp)
        if tp is Any:
            return value
        if origin is Union or isinstance(tp, types.UnionType):
            return self.union(typing.get_args(tp), value, key)
        if origin is Literal:
            return self.literal(typing.get_args(tp), value, key)
        if origin in (list, tuple) or tp in (list, tuple):
            return self.sequence(tp, value, key)
        if origin is dict or tp is dict:
            return self.mapping(tp, value, key)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.dataclass(tp, value, key)
        return self.scalar(tp, value, key)

    def scalar(self, tp: Any, value: Any, key: str) -> Any:
        if tp is type(None):
            return None if value is None else self.mismatch(key, "null", value)
        if tp is bool:
            return value if isinstance(value, bool) else self.mismatch(key, "bool", value)
        if tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            return value if ok else self.mismatch(key, "int", value)
        if tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return float(value) if ok else self.mismatch(key, "float", value)
        if tp is str:
            return value if isinstance(value, str) else self.mismatch(key, "str", value)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.enum(tp, value, key)
        if isinstance(tp, type) and issubclass(tp, PurePath):
            if isinstance(value, (str, PurePath)):
                return tp(value)
            return self.mismatch(key, "path string", value)
        if isinstance(tp, type):
            return value if isinstance(value, tp) else self.mismatch(key, tp.__name__, value)
        return self.fail(key, f"unsupported field type {_type_name(tp)} in the config schema")

    def enum(self, tp: type[enum.Enum], value: Any, key: str) -> Any:
        if isinstance(value, tp):
            return value
        for member in tp:
            if value == member.value or value == member.name:
                return member
        choices = [m.value for m in tp]
        return self.fail(key, f"{value!r} is not one of {choices}")

    def union(self, args: tuple[Any, ...], value: Any, key: str) -> Any:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return self.convert(options[0], value, key)
        for option in options:
            trial = _Converter(self.origins)
            result = trial.convert(option, value, key)
            if not trial.errors:
                return result
        names = " | ".join(_type_name(a) for a in args)
        return self.mismatch(key, names, value)

    def literal(self, choices: tuple[Any, ...], value: Any, key: str) -> Any:
        # Compare type too: True == 1 in Python, but a bool is not the literal 1.
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        hint = ""
        if isinstance(value, str):
            close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
        return self.fail(key, f"{value!r} is not one of {list(choices)}{hint}")

    def sequence(self, tp: Any, value: Any, key: str) -> Any:
        is_tuple = tp is tuple or typing.get_origin(tp) is tuple
        if not isinstance(value, (list, tuple)):
            return self.mismatch(key, "tuple" if is_tuple else "list", value)
        args = typing.get_args(tp)
        if is_tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(value):
                return self.fail(key, f"expected {len(args)} items, got {len(value)}: {value!r}")
            item_types = list(args)
        else:
            item_types = [args[0] if args else Any] * len(value)
        items = [
            self.convert(t, v, _join(key, i)) for i, (t, v) in enumerate(zip(item_types, value))
        ]
        if any(item is _INVALID for item in items):
            return _INVALID
        return tuple(items) if is_tuple else items

    def mapping(self, tp: Any, value: Any, key: str) -> Any:
        if not isinstance(value, Mapping):
            return self.mismatch(key, "mapping", value)
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        out = {}
        for k, v in value.items():
            sub = _join(key, k)
            ck = self.convert(key_type, k, sub)
            cv = self.convert(value_type, v, sub)
            out[ck] = cv
        if any(v is _INVALID for v in out.values()) or _INVALID in out:
            return _INVALID
        return out

    def dataclass(self, cls: type, value: Any, key: str) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            return self.mismatch(key, f"mapping for {cls.__name__}", value)
        if isinstance(schema := cls.__dict__.get("__config_schema__"), classmethod):
            try:  # a section whose schema its data names (e.g. a stage's ``app``)
                cls = schema.__func__(cls, value)
            except ValueError as e:
                return self.fail(key, str(e))
        prepare = getattr(cls, "__config_prepare__", None)
        if prepare is not None:
            try:  # facts stated once in the section flow into its parts (see forge.run.policy)
                value = prepare(dict(value))
            except ValueError as e:
                return self.fail(key, str(e))
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        allowed = [f.name for f in fields]
        for name in value:
            if name not in allowed:
                close = difflib.get_close_matches(str(name), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.fail(
                    _join(key, name),
                    f"unknown key {str(name)!r}{hint}; allowed keys: {', '.join(allowed)}",
                )
        kwargs: dict[str, Any] = {}
        failed = False
        for f in fields:
            sub = _join(key, f.name)
            if f.name in value:
                kwargs[f.name] = self.convert(hints[f.name], value[f.name], sub)
                failed |= kwargs[f.name] is _INVALID
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.fail(sub, "missing required value")
                failed = True
        if failed or any(not isinstance(n, str) or n not in allowed for n in value):
            return _INVALID
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:  # a __post_init__ check: report it with its key
            return self.fail(key, f"{cls.__name__}: {e}")
