"""DatasetActor: serves one data source to every rollout task of a run.

Endpoints (``call_one``): ``sample() -> dict``, ``heldout() -> list[dict]``,
``state_dict()`` / ``load_state_dict(state)`` (for checkpoints; no-ops for sources without
them). Spawn it with a data-source spec, which is resolved in the controller first (so a bad
import string fails before anything spawns) and built inside the actor::

    data = await DatasetActor.as_actor({"fn": "jsonl", "kwargs": {"path": "train.jsonl"}})
    data = await DatasetActor.as_actor(MySource)          # a class or zero-argument factory
"""

from __future__ import annotations

from typing import Any

from controller import endpoint
from forge.actors.forge_actor import ForgeActor
from forge.slots import DATA_SOURCE

__all__ = ["DatasetActor"]


class DatasetActor(ForgeActor):
    """Serves prompts; see the module docstring."""

    def __init__(self, source: Any):
        self.source = DATA_SOURCE.resolve(source, key="data")()
        missing = [m for m in ("sample", "heldout") if not callable(getattr(self.source, m, None))]
        if missing:
            raise TypeError(f"data source {type(self.source).__name__} lacks {missing}")

    @endpoint
    async def sample(self) -> dict:
        return self.source.sample()

    @endpoint
    async def heldout(self) -> list[dict]:
        return self.source.heldout()

    @endpoint
    async def state_dict(self) -> dict:
        fn = getattr(self.source, "state_dict", None)
        return fn() if callable(fn) else {}

    @endpoint
    async def load_state_dict(self, state: dict) -> None:
        fn = getattr(self.source, "load_state_dict", None)
        if callable(fn) and state:
            fn(state)
