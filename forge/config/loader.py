"""Load a YAML config file into a typed dataclass, and write one back.

The pipeline, in order: read YAML -> apply ``a.b=c`` overrides -> resolve ``${...}``
interpolations -> convert into the schema dataclass (see :mod:`forge.config.schema`).
Overrides come before interpolation, so ``max_len=512`` also moves every value written as
``${max_len}``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from forge.config.interpolate import resolve_interpolations
from forge.config.schema import config_from_dict, config_to_dict
from forge.config.yaml_io import parse_scalar, yaml_dump, yaml_load

__all__ = ["apply_overrides", "dump_config", "load_config", "load_config_dict"]

T = TypeVar("T")


def load_config(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), *, schema: type[T]
) -> T:
    """Read the YAML file at ``path`` into an instance of the dataclass ``schema``.

    ``overrides`` are ``"dotted.key=value"`` strings whose value is parsed as YAML
    (``trainer.optimizer.lr=1e-5``, ``x.flag=true``, ``x.list=[1,2]``). Raises ``ValueError`` naming
    the file and every bad key (unknown, wrong type, missing) at once.
    """
    data, origins = _load_with_origins(path, overrides)
    return config_from_dict(schema, data, source=str(path), origins=origins)


def load_config_dict(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> dict:
    """Like :func:`load_config` but stops before the schema: the resolved plain dict."""
    return _load_with_origins(path, overrides)[0]


def dump_config(cfg: Any, path: str | os.PathLike[str]) -> Path:
    """Write the resolved config ``cfg`` (a dataclass) as YAML to ``path``; return the path.

    The file loads back with :func:`load_config` into an equal config, so a run directory
    records exactly what ran.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml_dump(config_to_dict(cfg)))
    return out


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, str]:
    """Set each ``"a.b=c"`` override in ``data`` in place, creating missing mappings.

    Returns ``{dotted key: override text}`` so later errors can say which override set a
    bad value. Raises ``ValueError`` for an override without ``=`` or one that walks through
    a non-mapping value.
    """
    origins: dict[str, str] = {}
    for text in overrides:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {text!r} must look like 'dotted.key=value'")
        try:
            value = parse_scalar(raw)
        except yaml.YAMLError as e:
            raise ValueError(f"override {text!r}: value is not valid YAML: {e}") from None
        *parents, last = key.split(".")
        node: Any = data
        for i, part in enumerate(parents):
            node = _child(node, part, create=True, text=text, where=".".join(parents[:i]))
        _set(node, last, value, text, parent=".".join(parents))
        origins[key] = text
    return origins


def _child(node: Any, part: str, *, create: bool, text: str, where: str) -> Any:
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    if not isinstance(node, dict):
        raise ValueError(f"override {text!r}: {where!r} is not a mapping, cannot set keys in it")
    if node.get(part) is None and create:
        node[part] = {}
    return node[part]


def _set(node: Any, part: str, value: Any, text: str, parent: str) -> None:
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        node[int(part)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ValueError(f"override {text!r}: {parent!r} is not a mapping, cannot set keys in it")


def _load_with_origins(
    path: str | os.PathLike[str], overrides: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {source}") from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    origins = apply_overrides(data, overrides)
    return resolve_interpolations(data, source=source), origins
