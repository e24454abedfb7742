"""The runtime (``controller/``), the run's machinery (``forge/run/``) and the apps
(``apps/``, the Tinker SDK loops excepted) type-check clean under pyright, and typed handles
stay typed (tests/checks/typed_handles.py; a misspelt endpoint in an app:
tests/checks/test_typed_apps.py). The files and settings are pyproject.toml's
``[tool.pyright]``; ``bash scripts/check.sh`` runs the same with ruff."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REPO


@pytest.mark.skipif(
    shutil.which("pyright") is None,
    reason="pyright is not installed (pip install -e '.[dev]' installs it)",
)
def test_pyright_clean():
    r = subprocess.run(["pyright"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert "0 errors" in r.stdout, r.stdout[-8000:]
