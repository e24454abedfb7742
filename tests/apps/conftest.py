"""``tests/apps`` runs whole programs (``forge run`` on an app, a notebook, a chaos run): the
slow tier, every one of them. The fast tier is unit tests (no process), the runtime's and the
components' tests (real processes, one component at a time)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)
