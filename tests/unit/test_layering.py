"""Dependencies point one way: apps -> forge -> controller; controller stays torch-free."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO


def _imports(pkg: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (REPO / pkg).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO))] = names
    return found


def test_controller_never_imports_forge_or_apps():
    bad = {
        f: n & {"forge", "apps"} for f, n in _imports("controller").items() if n & {"forge", "apps"}
    }
    assert bad == {}


def test_forge_never_imports_apps():
    bad = {f: n & {"apps"} for f, n in _imports("forge").items() if "apps" in n}
    assert bad == {}


def _import_modules(pkg: str) -> dict[str, set[str]]:
    """Full module names each file of ``pkg`` imports (function-level imports too)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / pkg).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(REPO))] = names
    return found


def test_apps_import_forge_only_through_its_public_api():
    """``from forge import ...`` is the one import path for apps; ``controller`` is public."""
    bad = {
        f: sorted(m for m in names if m.startswith("forge."))
        for f, names in _import_modules("apps").items()
    }
    assert {f: m for f, m in bad.items() if m} == {}


def test_no_program_imports_another_app():
    """An app may import its own modules (``apps.calc.task`` from ``apps/calc``), no other
    app's; benchmarks may use an app's task (its data and reward), never its machinery; forge
    and the runtime import no app at all."""
    bad = {}
    for pkg in ("apps", "benchmarks", "forge", "controller"):
        for f, names in _import_modules(pkg).items():
            own = ".".join(Path(f).parts[:2]) if pkg == "apps" else None
            other = sorted(
                m
                for m in names
                if m.startswith("apps.")
                and not (own and m.startswith(own))
                and not (pkg == "benchmarks" and m.endswith(".task"))
            )
            if other:
                bad[f] = other
    assert bad == {}
