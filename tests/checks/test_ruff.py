"""The codebase stays ruff-clean (lint and format)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REPO

PATHS = ["controller", "forge", "apps", "tests", "benchmarks"]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_check_and_format():
    lint = subprocess.run(["ruff", "check", *PATHS], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run(
        ["ruff", "format", "--check", *PATHS], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
