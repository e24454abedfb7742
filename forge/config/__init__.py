"""Typed configs: YAML is only a surface.

A config file is read once, overridden with ``a.b=c`` strings, its ``${...}`` interpolations
resolved, and converted into nested dataclasses; unknown keys and wrong types are errors
naming the key and the file, raised before anything is spawned::

    from apps.sft.main import Config

    cfg = load_config("apps/sft/configs/sumdigits.yaml", ["trainer.optimizer.lr=1e-4"], schema=Config)
    dump_config(cfg, run_dir / "config.yaml")
"""

from forge.config.interpolate import resolve_interpolations
from forge.config.loader import apply_overrides, dump_config, load_config, load_config_dict
from forge.config.schema import config_from_dict, config_to_dict

__all__ = [
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "load_config",
    "load_config_dict",
    "resolve_interpolations",
]
