"""Dependencies point one way: apps -> forge -> controller, and inside forge down its floors
(CONTRIBUTING.md); controller stays torch-free."""

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


FLOORS: list[tuple[str, ...]] = [
    ("types", "settings", "plugins", "durable"),
    ("slots", "config", "replay", "losses", "rewards", "weights"),
    ("models", "generation", "training", "observability", "envs", "data", "integrations"),
    ("actors",),
    ("rollout", "evaluation", "run", "serve", "launch"),
    ("__init__", "notebook"),
    ("cli",),
]
"""The floors inside ``forge/``, bottom to top (CONTRIBUTING.md names them): a part imports
its own floor and the ones below, never one above. ``__init__`` is the public API
(``from forge import ...``); ``cli`` holds the commands, which nothing imports."""


def _floor_of(part: str) -> int:
    for i, parts in enumerate(FLOORS):
        if part in parts:
            return i
    raise AssertionError(
        f"forge/{part} is on no floor: add it to FLOORS in tests/unit/test_layering.py and to "
        "the floors in CONTRIBUTING.md"
    )


def _forge_parts_imported(path: Path) -> set[str]:
    """The parts of forge (its subpackages and top-level modules) a file imports, function-level
    and ``TYPE_CHECKING`` imports included; ``from forge import x`` is the public API unless
    ``x`` is a module of its own (``from forge import settings``)."""
    parts: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            if node.module == "forge":
                modules = [
                    f"forge.{a.name}"
                    for a in node.names
                    if (REPO / "forge" / f"{a.name}.py").exists()
                    or (REPO / "forge" / a.name).is_dir()
                ] or ["forge"]
        else:
            continue
        for m in modules:
            if m == "forge":
                parts.add("__init__")
            elif m.startswith("forge."):
                parts.add(m.split(".")[1])
    return parts


def _part_of(path: Path) -> str:
    rel = path.relative_to(REPO / "forge")
    return rel.parts[0].removesuffix(".py")


def test_every_part_of_forge_stands_on_a_floor():
    parts = {_part_of(p) for p in (REPO / "forge").glob("*") if p.suffix == ".py" or p.is_dir()}
    parts.discard("__pycache__")
    for part in sorted(parts):
        _floor_of(part)


def test_forge_imports_point_down_its_floors():
    """A lower floor never imports a higher one (``models`` never imports ``actors``, nothing
    below ``cli`` imports a command: ``forge.notebook`` shows ``forge top``'s frame through
    ``forge.observability.status_view``, not the program)."""
    upward = {}
    for path in sorted((REPO / "forge").rglob("*.py")):
        part = _part_of(path)
        floor = _floor_of(part)
        above = sorted(p for p in _forge_parts_imported(path) if _floor_of(p) > floor)
        if above:
            upward[str(path.relative_to(REPO))] = above
    assert upward == {}, (
        "these files import a floor above their own (tests/unit/test_layering.py FLOORS, "
        "CONTRIBUTING.md): move the shared code down, or the file up"
    )
