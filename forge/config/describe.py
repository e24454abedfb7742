"""What a config's fields mean, and a loaded config shown with them.

Every config field carries its documentation as an *attribute docstring*: a string literal
on the line under the field (the convention Sphinx, pyright and editors read)::

    @dataclass
    class ReplicasConfig:
        generator: int = 1
        \"\"\"Generator replicas (each a process with its own engine).\"\"\"

:func:`field_docs` reads them from the class's source; :func:`show_config` prints a loaded
config as a YAML-like tree, each value with its default where it differs and the first line
of its field's doc (``forge config show X.yaml`` and ``forge run --dry-run``).

A key whose value is copied from another key when the config loads (a role's ``seed`` from
the run's, ``trainer.model`` from ``policy.model``) is not a knob of its own. A dataclass
names such keys with a third hook, ``__config_derived__(cls) -> {key: the key it follows}``
(a classmethod; both dotted and relative to the dataclass's own section). Where a derived
key holds its source's value, :func:`show_config` prints a scalar as ``key: value  # = source``
and leaves a section out, writing ``# key: = source`` in its place; the source is named by
its full dotted key, followed to the key that is stated (``seed`` rather than ``rl.seed``).
Loading the printed text gives the same config again, since loading copies those values.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

import yaml

from forge.config.schema import config_to_dict

__all__ = ["field_default", "field_docs", "show_config"]

_NO_DEFAULT = object()


@functools.cache
def _own_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings written in ``cls``'s own body (not its bases')."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in a REPL or generated: no source to read
        return {}
    body = next((n.body for n in ast.parse(source).body if isinstance(n, ast.ClassDef)), [])
    docs: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: its attribute docstring}`` for the dataclass ``cls``, inherited fields
    included (the nearest class that documents a field wins); undocumented fields are left
    out."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in docs.items() if k in names}


def field_default(f: dataclasses.Field) -> Any:
    """The field's default value, or ``_NO_DEFAULT`` for a required field (or a default
    factory that cannot run on its own)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        try:
            return f.default_factory()
        except (TypeError, ValueError):
            return _NO_DEFAULT
    return _NO_DEFAULT


def first_line(doc: str) -> str:
    """The first sentence-line of a docstring, for one-line listings."""
    return doc.strip().split("\n\n")[0].replace("\n", " ").strip()


def scalar_text(value: Any) -> str:
    """``value`` (plain data) as one line of flow-style YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def show_config(cfg: Any) -> str:
    """The loaded config ``cfg`` (a dataclass) as an annotated YAML-like tree: each field's
    value, ``# default: X`` where the value differs from the field's default, and the first
    line of the field's doc; derived keys are marked with the key they follow (see the
    module). Sections whose schema is chosen by their data (a pipeline's stages) show the
    fields of the schema that was chosen."""
    lines: list[str] = []
    _show(cfg, 0, lines, _View(cfg))
    return "\n".join(lines) + "\n"


class _View:
    """The printed config's root, and its derived keys by full dotted key."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.derived: dict[str, str] = {}

    def enter(self, cfg: Any, prefix: str) -> None:
        """Record the derived keys that ``cfg``'s section (at ``prefix``) declares."""
        hook = getattr(type(cfg), "__config_derived__", None)
        for key, source in (hook() if hook is not None else {}).items():
            self.derived[prefix + key] = prefix + source

    def value(self, path: str) -> Any:
        node = self.root
        for name in path.split("."):
            if not _is_config(node) or not hasattr(node, name):
                return _NO_DEFAULT
            node = getattr(node, name)
        return node

    def follows(self, path: str, value: Any) -> str | None:
        """The key that ``path`` (holding ``value``) follows, or ``None`` when it is not
        derived or holds a value of its own."""
        source = self.derived.get(path)
        if source is None:
            return None
        held = self.value(source)
        if held is _NO_DEFAULT or config_to_dict(held) != config_to_dict(value):
            return None
        return self.follows(source, held) or source


def _is_config(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _note(default: Any, value: Any, doc: str) -> str:
    parts = []
    if default is _NO_DEFAULT:
        parts.append("required")
    elif not _is_config(value) and config_to_dict(default) != config_to_dict(value):
        parts.append(f"default: {scalar_text(config_to_dict(default))}")
    if doc:
        parts.append(first_line(doc))
    return f"  # {'; '.join(parts)}" if parts else ""


def _show(cfg: Any, indent: int, lines: list[str], view: _View, prefix: str = "") -> None:
    pad = "  " * indent
    docs = field_docs(type(cfg))
    view.enter(cfg, prefix)
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue
        value = getattr(cfg, f.name)
        source = view.follows(prefix + f.name, value)
        if source is not None and _is_config(value):
            lines.append(f"{pad}# {f.name}: = {source}")
            continue
        if source is not None:
            lines.append(f"{pad}{f.name}: {scalar_text(config_to_dict(value))}  # = {source}")
            continue
        note = _note(field_default(f), value, docs.get(f.name, ""))
        if _is_config(value):
            lines.append(f"{pad}{f.name}:{note}")
            _show(value, indent + 1, lines, view, f"{prefix}{f.name}.")
        elif isinstance(value, (list, tuple)) and value and any(_is_config(v) for v in value):
            lines.append(f"{pad}{f.name}:{note}")
            for item in value:
                if _is_config(item):
                    lines.append(f"{pad}  -")
                    _show(item, indent + 2, lines, _View(item))
                else:
                    lines.append(f"{pad}  - {scalar_text(config_to_dict(item))}")
        else:
            lines.append(f"{pad}{f.name}: {scalar_text(config_to_dict(value))}{note}")
