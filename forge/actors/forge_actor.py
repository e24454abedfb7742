"""``ForgeActor``: what every Forge component shares — per-step metrics and busy time (and
``actor_config``, how an actor reads the config it is constructed with).

Actors call ``record_metric`` wherever they are; the controller's training loop gathers the
partial states each step with ``flush_metrics`` (``call``/``fanout``) and reduces them across
processes (``forge.observability.merge_states``). Wrapping work in ``with self.busy():``
makes ``flush_metrics`` also report ``<name>/busy_fraction``: the share of wall time since
the last flush during which the actor had work in progress.
"""

from __future__ import annotations

import contextlib
import time
from typing import TypeVar

from controller import Actor, endpoint, env_vars
from forge.observability import Reduce, get_collector, record_metric

C = TypeVar("C")

# What an actor that holds a model imports: its processes fork from a zygote that has
# (``Actor.preload``; ``forge.run.actor_env_vars`` names it for every role of a run).
MODEL_PRELOAD = (
    "torch,transformers,transformers.modeling_utils,transformers.models.auto.modeling_auto"
)


def use_deterministic_kernels() -> None:
    """In an actor process of a deterministic run (``FORGE_DETERMINISTIC=1``, set by
    ``forge.run.actor_env_vars``): torch's deterministic algorithms; an op without one raises.
    Components that compute with torch call this first thing in ``setup``."""
    if env_vars.deterministic():
        import torch

        torch.use_deterministic_algorithms(True)


def actor_config(config_cls: type[C], config: object, actor: str) -> C:
    """An actor's config argument as a ``config_cls``: as given, or built from a dict of its
    fields (``forge.config.config_from_dict``: an unknown key or a wrong type is an error
    naming the key). Anything else is a ``TypeError`` naming the actor and what it takes."""
    if isinstance(config, config_cls):
        return config
    if isinstance(config, dict):
        from forge.config.schema import config_from_dict

        return config_from_dict(config_cls, config, source=f"{actor}(config)")
    raise TypeError(
        f"{actor} takes a {config_cls.__name__} (or a dict of its fields), got "
        f"{type(config).__name__}"
    )


class ForgeActor(Actor):
    """Base class of Forge's actors (see the module docstring)."""

    _busy_name = "actor"

    def _busy_state(self) -> dict:
        st = self.__dict__.get("_forge_busy")
        if st is None:
            now = time.perf_counter()
            st = self.__dict__["_forge_busy"] = {
                "active": 0,
                "since": now,
                "busy": 0.0,
                "window": now,
            }
        return st

    @contextlib.contextmanager
    def busy(self):
        st = self._busy_state()
        now = time.perf_counter()
        if st["active"] == 0:
            st["since"] = now
        st["active"] += 1
        try:
            yield
        finally:
            st["active"] -= 1
            if st["active"] == 0:
                st["busy"] += time.perf_counter() - st["since"]

    @endpoint
    async def flush_metrics(self) -> dict:
        """This process's metric states since the last flush (and busy fraction)."""
        st = self._busy_state()
        now = time.perf_counter()
        busy = st["busy"] + (now - st["since"] if st["active"] else 0.0)
        if st["active"]:
            st["since"] = now
        window = max(now - st["window"], 1e-9)
        record_metric(f"{self._busy_name}/busy_fraction", min(1.0, busy / window), Reduce.MEAN)
        st["busy"], st["window"] = 0.0, now
        return get_collector().flush()
