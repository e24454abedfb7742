"""Forge's actors and their configs: ``from forge.actors import Generator, GeneratorConfig``.

Names load lazily (PEP 562), so importing this package does not pull in torch until an
actor is used.
"""

from __future__ import annotations

import importlib
from typing import Any

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
