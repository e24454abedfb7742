"""YAML reading and writing with YAML 1.2 scalar rules.

PyYAML follows YAML 1.1, where ``1e-5`` is a *string* (a float needs a dot) and ``yes``,
``no``, ``on``, ``off`` are booleans. Both bite RL configs (``lr: 1e-5``, a key named ``on``),
so Forge's loader and dumper use the YAML 1.2 core rules instead: booleans are only
``true``/``false`` (any case), and ``1e-5``, ``.5``, ``+3.0e2`` are floats. The dumper quotes
every string that either rule set would misread (``"1e-5"``, ``"yes"``), so files round-trip
and still read the same in other YAML tools.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["parse_scalar", "yaml_dump", "yaml_load"]

_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_BOOL_FIRST = list("tTfF")
_FLOAT_FIRST = list("-+0123456789.")


def _with_yaml12_scalars(cls: type) -> type:
    """Replace the class's bool and float implicit resolvers with the YAML 1.2 ones."""
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if not tag.endswith((":bool", ":float"))]
        for first, entries in cls.yaml_implicit_resolvers.items()
    }
    cls.yaml_implicit_resolvers = resolvers
    cls.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_RE, _BOOL_FIRST)
    cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, _FLOAT_FIRST)
    return cls


@_with_yaml12_scalars
class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    """Quotes any string that a YAML 1.1 *or* 1.2 reader would take for a bool or float."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, _FLOAT_FIRST)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    # SafeLoader's constructor looks the word up in a YAML 1.1 table keyed by lower case;
    # our resolver only lets true/false through, so lower() is enough.
    return loader.construct_scalar(node).lower() == "true"


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).replace("_", "").lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def yaml_load(text: str) -> Any:
    """Parse a YAML document with YAML 1.2 scalar rules."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader


def parse_scalar(text: str) -> Any:
    """Parse a command-line value as YAML: ``"1e-5"`` -> 1e-05, ``"[1,2]"`` -> [1, 2]."""
    return yaml_load(text)


def yaml_dump(data: Any) -> str:
    """Serialise plain data (dicts, lists, scalars) as block-style YAML, keeping key order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
