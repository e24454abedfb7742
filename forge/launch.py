"""Apps by name: import the app a config names and load the config with its schema.

An app is a module (named by the config's ``app:`` key, e.g. ``apps.grpo.main``) that defines

- ``Config``: a dataclass, the schema of its YAML (it must have an ``app: str`` field), and
- ``async def run(cfg, run_dir: Path, resume: bool) -> None``, and, to serve as a stage of
  a pipeline (``forge.run.pipeline``: SFT, then RL), ``async def stage(cfg, run_dir,
  resume) -> dict`` returning at least ``{"model": <the trained policy's directory>}``
  where it trains one.

``forge run`` (``forge.cli.run``), ``forge eval`` and a pipeline's stages load apps through
``load_app`` and ``app_module``; ``new_run_dir`` names a run's directory.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from forge import settings


def app_module(app: Any, where: str, needs: tuple[str, ...] = ("Config", "run")) -> Any:
    """Import the app module named ``app`` (``where`` says who named it, for errors) and
    check it defines ``needs``."""
    if not isinstance(app, str) or not app:
        raise ValueError(
            f"{where}: missing key 'app' naming the app module, e.g. 'app: apps.grpo.main'"
        )
    try:
        module = importlib.import_module(app)
    except ModuleNotFoundError as e:
        raise ValueError(f"{where}: app module {app!r} cannot be imported: {e}") from e
    for attr in needs:
        if not hasattr(module, attr):
            raise ValueError(f"app module {app!r} defines no {attr!r}; see forge/launch.py")
    return module


def load_app(config_path: str | Path, overrides: list[str]) -> tuple[Any, Any]:
    """Import the app named by the config and parse the config with its schema."""
    from forge.config import load_config, load_config_dict

    raw = load_config_dict(config_path, overrides)
    module = app_module(raw.get("app") if isinstance(raw, dict) else None, str(config_path))
    return module, load_config(config_path, overrides, schema=module.Config)


def new_run_dir(app: str, root: Path | None = None) -> Path:
    root = Path(root or settings.get_run_dir())
    name = app.split(".")[-2] if app.endswith(".main") else app.split(".")[-1]
    path = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 0
    while path.exists():
        suffix += 1
        path = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
    path.mkdir(parents=True)
    return path
