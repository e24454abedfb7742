"""Forge's actors and their configs: ``from forge.actors import Generator, GeneratorConfig``.

Names load lazily (PEP 562), so importing this package does not pull in torch until an
actor is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "Critic": "forge.actors.critic",
    "CriticConfig": "forge.training.value_model",
    "DatasetActor": "forge.actors.dataset",
    "EnvActor": "forge.actors.env_actor",
    "Generator": "forge.actors.generator",
    "GeneratorConfig": "forge.generation.backend",
    "ReferenceConfig": "forge.training.trainer_config",
    "ReferenceModel": "forge.actors.reference_model",
    "ReplayBuffer": "forge.actors.replay_buffer",
    "ReplayBufferConfig": "forge.actors.replay_buffer",
    "RewardActor": "forge.actors.reward",
    "RewardModel": "forge.actors.reward_model",
    "RewardModelConfig": "forge.models.reward_classifier",
    "Teacher": "forge.actors.teacher",
    "Trainer": "forge.actors.trainer",
    "TrainerConfig": "forge.training.trainer_config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge.actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Every lazy name, for type checkers and editors (PEP 562's ``__getattr__`` is opaque to
# them): ``trainer.train_step`` in an app resolves to the endpoint, and "go to definition"
# works. tests/unit/test_public_api.py checks this block names exactly ``_EXPORTS``.
if TYPE_CHECKING:  # pragma: no cover - never runs
    from forge.actors.critic import Critic
    from forge.actors.dataset import DatasetActor
    from forge.actors.env_actor import EnvActor
    from forge.actors.generator import Generator
    from forge.actors.reference_model import ReferenceModel
    from forge.actors.replay_buffer import (
        ReplayBuffer,
        ReplayBufferConfig,
    )
    from forge.actors.reward import RewardActor
    from forge.actors.reward_model import RewardModel
    from forge.actors.teacher import Teacher
    from forge.actors.trainer import Trainer
    from forge.generation.backend import GeneratorConfig
    from forge.models.reward_classifier import RewardModelConfig
    from forge.training.trainer_config import (
        ReferenceConfig,
        TrainerConfig,
    )
    from forge.training.value_model import CriticConfig
