"""File names say what a file holds: no two forge modules share a basename, and "env" names an
RL environment only (process environment variables live in ``forge/settings.py`` and
``controller/env_vars.py``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.helpers import REPO


def _modules(pkg: str) -> list[str]:
    return sorted(
        str(p.relative_to(REPO)) for p in (REPO / pkg).rglob("*.py") if p.name != "__init__.py"
    )


def test_forge_module_basenames_are_unique():
    """``training/config.py`` next to ``serve/config.py`` makes a traceback, a grep hit or an
    editor tab ambiguous; each module's name says what it holds instead."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules("forge"):
        by_name[Path(path).name].append(path)
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}, f"forge modules that share a basename (rename one): {shared}"


def test_no_module_is_named_env():
    """``env`` means an RL environment (``forge.envs``, ``EnvActor``, ``build_env``); a module
    of process environment variables is named for them, not ``env.py``."""
    bad = [p for pkg in ("forge", "controller") for p in _modules(pkg) if Path(p).name == "env.py"]
    assert bad == [], f"rename these (process variables are not RL environments): {bad}"
