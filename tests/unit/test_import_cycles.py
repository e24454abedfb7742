"""No import circles inside a package: its modules form a DAG.

The graph is read from the source (``ast``), not from ``sys.modules``: every ``import`` and
``from ... import`` statement anywhere in a file counts, at module level, inside functions
and under ``if TYPE_CHECKING:`` alike, because a function-level import only hides a circle
(it still ties the two modules together). ``from pkg import name`` is an edge to the module
``pkg.name`` when there is one, else to ``pkg`` itself (its ``__init__``). Importing
``pkg.a.b`` does not count as importing the package ``pkg.a`` (Python runs it, but every
package's ``__init__`` re-exporting its modules would otherwise be a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO


def module_names(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a (possibly relative) ``from`` statement imports from."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}``."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, node, is_package)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in modules else source)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` if the graph has none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in done:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found:
                return found
    return None


@pytest.mark.parametrize("package", ["controller", "forge"])
def test_no_import_cycles(package):
    graph = import_graph(REPO, package)
    assert len(graph) > 5, f"found no modules of {package!r} under {REPO}"
    cycle = find_cycle(graph)
    if cycle:
        print(f"import cycle in {package}: " + " -> ".join(cycle))
    assert cycle is None, f"import cycle in {package}: " + " -> ".join(cycle or [])


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import b\n\nclass A:\n    pass\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    import pkg.a\n"
    )
    (pkg / "c.py").write_text("X = 1\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a", "pkg.c"},
        "pkg.c": set(),
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("from .c import X\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
