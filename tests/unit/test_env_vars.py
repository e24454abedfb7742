"""``FORGE_*`` environment variables are read in one module, and each one is documented.

``controller/env_vars.py`` is the only file that reads a ``FORGE_*`` variable from ``os.environ``
(writing one into a child process's environment dict is fine); its docstring table lists
every variable, and ``docs/configuration.md`` names each of them.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

ENV_MODULE = Path(REPO) / "controller" / "env_vars.py"
DOC = Path(REPO) / "docs" / "configuration.md"
SKIP_DIRS = {".venv", "venv", "build", "dist", ".git", "node_modules", "forge.egg-info"}
VAR = re.compile(r"\bFORGE_[A-Z0-9_]+\b")


def _py_files() -> list[Path]:
    """The repository's Python files. Hidden directories (``.git``, virtual environments such
    as ``.venv-vllm``, which a script may be building or deleting meanwhile) are not walked."""
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        out += [Path(root, f) for f in files if f.endswith(".py")]
    return [p for p in out if p != ENV_MODULE]


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ`` (``from os import environ``)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def _env_reads(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    """``(line, key expression)`` of every read of the environment in ``tree``."""
    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop") and _is_environ(f.value):
                reads.append((node.lineno, node.args[0]))  # os.environ.get(key)
            elif (isinstance(f, ast.Attribute) and f.attr == "getenv") or (
                isinstance(f, ast.Name) and f.id == "getenv"
            ):
                reads.append((node.lineno, node.args[0]))  # os.getenv(key)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if _is_environ(node.value):
                reads.append((node.lineno, node.slice))  # os.environ[key]
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            reads.append((node.lineno, node.left))  # key in os.environ
    return reads


def _string_constants(tree: ast.AST) -> dict[str, list[str]]:
    """Names bound to string literals in ``tree``: module constants (``ENV = "FORGE_X"``,
    tuple assignments) and loop variables over literal tuples (``for var in ("A", "B")``)."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = []
                if isinstance(target, ast.Name):
                    pairs = [(target, node.value)]
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    if isinstance(t, ast.Name) and isinstance(v, ast.Constant):
                        if isinstance(v.value, str):
                            out.setdefault(t.id, []).append(v.value)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            if isinstance(node.iter, (ast.Tuple, ast.List)):
                values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
                out.setdefault(node.target.id, []).extend(v for v in values if isinstance(v, str))
    return out


def _key_values(key: ast.AST, names: dict[str, list[str]]) -> list[str]:
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return [key.value]
    if isinstance(key, ast.Name):
        return names.get(key.id, [])
    if isinstance(key, ast.Attribute):  # e.g. env_vars.SESSION_DIR, _runtime.ENV_DIR
        return names.get(key.attr, [])
    return []


def _documented() -> set[str]:
    return set(VAR.findall(ast.get_docstring(ast.parse(ENV_MODULE.read_text())) or ""))


def test_only_controller_env_vars_reads_forge_variables():
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in _py_files()}
    # Constant names from every module (a constant may be imported from another one).
    shared: dict[str, list[str]] = {}
    for tree in [*trees.values(), ast.parse(ENV_MODULE.read_text())]:
        for name, values in _string_constants(tree).items():
            shared.setdefault(name, []).extend(v for v in values if VAR.fullmatch(v))
    bad = []
    for path, tree in trees.items():
        names = {**shared, **_string_constants(tree)}
        for line, key in _env_reads(tree):
            hits = [v for v in _key_values(key, names) if v.startswith("FORGE_")]
            if hits:
                bad.append(f"{path.relative_to(REPO)}:{line} reads {hits}")
    assert bad == [], "read FORGE_* variables through controller.env_vars:\n" + "\n".join(bad)


def test_the_check_catches_reads():
    src = (
        'import os\nENV = "FORGE_X"\n'
        'a = os.environ.get("FORGE_A")\nb = os.environ[ENV]\nc = os.getenv("FORGE_C")\n'
        'for v in ("FORGE_D", "HOME"):\n    os.environ.get(v)\n'
        'e = "FORGE_E" in os.environ\nchild = {}\nchild["FORGE_F"] = "1"\n'
    )
    tree = ast.parse(src)
    names = _string_constants(tree)
    read = sorted(v for _, k in _env_reads(tree) for v in _key_values(k, names))
    assert read == ["FORGE_A", "FORGE_C", "FORGE_D", "FORGE_E", "FORGE_X", "HOME"]


def test_every_variable_read_is_in_the_table():
    tree = ast.parse(ENV_MODULE.read_text())
    names = _string_constants(tree)
    read = {v for _, k in _env_reads(tree) for v in _key_values(k, names) if VAR.fullmatch(v)}
    assert read, "found no reads in controller/env_vars.py; the check is broken"
    assert read - _documented() == set(), "add these to the table in controller/env_vars.py"


def test_every_variable_is_in_the_docs():
    documented = _documented()
    assert len(documented) >= 10
    doc = DOC.read_text()
    missing = sorted(v for v in documented if v not in doc)
    assert missing == [], f"add these to {DOC.relative_to(REPO)}: {missing}"


def test_accessors_read_when_called(monkeypatch):
    from controller import env_vars

    for name in ("FORGE_BACKEND", "FORGE_LOG_LEVEL", "FORGE_SESSION_DIR", "FORGE_SESSION_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert env_vars.backend() == "local" and env_vars.log_level() == "WARNING"
    assert env_vars.inherited_session() is None
    monkeypatch.setenv("FORGE_BACKEND", " Ray ")
    monkeypatch.setenv("FORGE_LOG_LEVEL", "debug")
    assert env_vars.backend() == "ray" and env_vars.log_level("INFO") == "DEBUG"
    monkeypatch.setenv("FORGE_BACKEND", "hosts")
    with pytest.raises(ValueError, match="was removed: start a Ray cluster"):
        env_vars.backend()
    monkeypatch.setenv("FORGE_BACKEND", "slurm")
    with pytest.raises(ValueError, match=r"unknown FORGE_BACKEND 'slurm'; choose one of"):
        env_vars.backend()
    monkeypatch.setenv("FORGE_SESSION_DIR", "/tmp/s")
    monkeypatch.setenv("FORGE_SESSION_KEY", "00ff")
    assert env_vars.inherited_session() == env_vars.InheritedSession("/tmp/s", b"\x00\xff", None)
    for name, value in (("MESH", "m"), ("RANK", "3"), ("SIZE", "4"), ("ADDRESS", "unix:/a")):
        monkeypatch.setenv(f"FORGE_{name}", value)
    monkeypatch.setenv("FORGE_SHAPE", '{"procs": 4}')
    assert env_vars.worker_place() == env_vars.WorkerPlace("m", 3, 4, {"procs": 4}, "unix:/a")
