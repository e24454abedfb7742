"""Forge's settings from environment variables, built on :mod:`controller.env_vars`.

``controller.env_vars`` is the one module that reads ``FORGE_*`` variables (``controller``
cannot import ``forge``, so the reader lives there); its docstring and
``docs/configuration.md`` list every variable. The ones Forge's own code reads:

=====================  ===================  ====================================================
Variable               Default              Meaning
=====================  ===================  ====================================================
``FORGE_LOG_LEVEL``    ``INFO``             Logging level name (:func:`get_log_level`).
``FORGE_RUN_DIR``      ``runs``             Parent folder of run directories (resolved config,
                                            ``metrics.jsonl``, checkpoints).
``FORGE_CACHE_DIR``    ``~/.cache/forge``   Where tiny test models and other derived artefacts
                                            are built and kept.
``FORGE_CALL_TIMEOUT_S`` ``600``            Default bound of remote calls that would otherwise
                                            wait without one (:func:`get_call_timeout_s`).
=====================  ===================  ====================================================

Config files may also name arbitrary variables with ``${env:VAR}``; those are read through
:func:`get_env_var`.
"""

from __future__ import annotations

from pathlib import Path

from controller import env_vars

__all__ = ["get_cache_dir", "get_call_timeout_s", "get_env_var", "get_log_level", "get_run_dir"]


def get_env_var(name: str) -> str | None:
    """Return the raw value of environment variable ``name``, or ``None`` when unset."""
    return env_vars.get(name)


def get_log_level() -> str:
    """Logging level name from ``FORGE_LOG_LEVEL`` (default ``"INFO"``), upper-cased."""
    return env_vars.log_level(default="INFO")


def get_run_dir() -> Path:
    """Parent folder for run directories, from ``FORGE_RUN_DIR`` (default ``runs``)."""
    return env_vars.run_dir()


def get_cache_dir() -> Path:
    """Cache folder for built tiny models, from ``FORGE_CACHE_DIR`` (default ~/.cache/forge)."""
    return env_vars.cache_dir()


def get_call_timeout_s() -> float | None:
    """Default bound, in seconds, of remote calls that would otherwise wait without one
    (``FORGE_CALL_TIMEOUT_S``, default 600; ``None`` when set to ``0``): give it to a mesh
    with ``mesh.with_default_timeout(get_call_timeout_s())``."""
    return env_vars.call_timeout_s()
