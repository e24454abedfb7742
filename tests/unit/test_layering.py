"""Dependencies point one way: apps -> forge -> controller; controller stays torch-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, script_env


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


def test_import_controller_does_not_import_torch():
    code = "import sys, controller; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=str(Path(REPO)),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
