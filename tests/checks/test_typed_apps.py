"""Types reach the apps: a misspelt endpoint in an app is a type error, and the packages that
load their names lazily still show every name to a type checker.

``forge``, ``forge.actors`` and ``forge.generation`` load their exports on first use (PEP
562); an ``if TYPE_CHECKING:`` block in each imports the same names from their modules, so
pyright follows ``handles.trainer.export_hf`` from an app into ``forge/actors/trainer.py``.
"""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

LAZY_PACKAGES = ["forge.actors", "forge.generation"]  # forge itself: tests/unit/test_public_api.py

TYPOS = {  # app -> (endpoint as written, the typo)
    "apps/grpo/main.py": ("handles.trainer.export_hf.", "handles.trainer.export_hff."),
    "apps/reinforce/main.py": ("trainer.train_step.", "trainer.train_stepp."),
}


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_type_checkers_see_every_lazy_name_from_its_module(package):
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text())
    blocks = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, f"{package} needs one `if TYPE_CHECKING:` block of imports"
    seen = {
        alias.asname or alias.name: node.module
        for node in blocks[0].body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == module._EXPORTS


@pytest.mark.skipif(
    shutil.which("pyright") is None,
    reason="pyright is not installed (pip install -e '.[dev]' installs it)",
)
def test_a_misspelt_endpoint_in_an_app_fails_the_type_check(tmp_path):
    """Copies of two apps, each with one endpoint name misspelt, checked with the project's
    settings: pyright reports the misspelling, on its line, and nothing else."""
    expected = set()
    for app, (right, wrong) in TYPOS.items():
        source = (REPO / app).read_text()
        assert source.count(right) == 1, f"{app} no longer calls {right!r}: update TYPOS"
        copy = tmp_path / app.replace("/", "_")
        copy.write_text(source.replace(right, wrong))
        line = source[: source.index(right)].count("\n") + 1
        expected.add((copy.name, line, wrong.split(".")[-2]))
    r = subprocess.run(
        ["pyright", "--outputjson", *sorted(str(p) for p in tmp_path.glob("*.py"))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(r.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    found = {
        (Path(d["file"]).name, d["range"]["start"]["line"] + 1, d["message"].split('"')[1])
        for d in errors
        if d.get("rule") == "reportAttributeAccessIssue"
    }
    assert found == expected, json.dumps(errors, indent=1)[-6000:]
    assert len(errors) == len(expected), json.dumps(errors, indent=1)[-6000:]
