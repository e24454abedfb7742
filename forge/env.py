"""The one place where Forge reads environment variables.

Every accessor reads ``os.environ`` when called, never at import time, so tests can set a
variable with ``monkeypatch.setenv`` and see the effect immediately.

=====================  ===================  ====================================================
Variable               Default              Meaning
=====================  ===================  ====================================================
``FORGE_BACKEND``      ``local``            Actor runtime: ``local`` (processes on this machine)
                                            or ``monarch`` (needs ``forge[monarch]``).
``FORGE_LOG_LEVEL``    ``INFO``             Python logging level name for Forge's loggers.
``FORGE_RUN_DIR``      ``runs``             Parent folder of run directories (resolved config,
                                            ``metrics.jsonl``, checkpoints).
``FORGE_CACHE_DIR``    ``~/.cache/forge``   Where tiny test models and other derived artefacts
                                            are built and kept.
``FORGE_NUM_THREADS``  unset                ``torch.set_num_threads`` value for each process;
                                            unset leaves torch's own choice.
=====================  ===================  ====================================================

Config files may also name arbitrary variables with ``${env:VAR}``; those are read through
:func:`get_env_var` so that this module stays the only reader of the environment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = [
    "BACKENDS",
    "get_backend",
    "get_cache_dir",
    "get_env_var",
    "get_log_level",
    "get_num_threads",
    "get_run_dir",
]

BACKENDS = ("local", "monarch")


def get_env_var(name: str) -> str | None:
    """Return the raw value of environment variable ``name``, or ``None`` when unset."""
    return os.environ.get(name)


def get_backend() -> str:
    """Actor runtime backend from ``FORGE_BACKEND``: ``"local"`` (default) or ``"monarch"``."""
    value = os.environ.get("FORGE_BACKEND", "local").strip().lower() or "local"
    if value not in BACKENDS:
        raise ValueError(f"FORGE_BACKEND={value!r} is not a backend; choose one of {BACKENDS}")
    return value


def get_log_level() -> str:
    """Logging level name from ``FORGE_LOG_LEVEL`` (default ``"INFO"``), upper-cased."""
    value = os.environ.get("FORGE_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    # getLevelName maps a known name to its int and an unknown one to the string "Level X".
    if not isinstance(logging.getLevelName(value), int):
        raise ValueError(
            f"FORGE_LOG_LEVEL={value!r} is not a logging level; "
            "choose one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
        )
    return value


def get_run_dir() -> Path:
    """Parent folder for run directories, from ``FORGE_RUN_DIR`` (default ``runs``)."""
    return Path(os.environ.get("FORGE_RUN_DIR") or "runs").expanduser()


def get_cache_dir() -> Path:
    """Cache folder for built tiny models, from ``FORGE_CACHE_DIR`` (default ~/.cache/forge)."""
    return Path(os.environ.get("FORGE_CACHE_DIR") or "~/.cache/forge").expanduser()


def get_num_threads() -> int | None:
    """Torch threads per process from ``FORGE_NUM_THREADS``; ``None`` when unset or empty."""
    raw = os.environ.get("FORGE_NUM_THREADS", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"FORGE_NUM_THREADS={raw!r} must be a positive integer or unset")
    return value
