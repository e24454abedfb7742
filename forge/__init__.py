"""Forge: RL post-training for LLMs. The public API; apps import from here.

Names load lazily (PEP 562), so ``import forge`` and ``forge --help`` stay fast and pull in
torch/transformers only when a component is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # actors
    "DatasetActor": "forge.actors.dataset",
    "Generator": "forge.actors.generator",
    "Trainer": "forge.actors.trainer",
    "ReferenceModel": "forge.actors.reference_model",
    "ReplayBuffer": "forge.actors.replay_buffer",
    "ReplayBufferConfig": "forge.actors.replay_buffer",
    "RewardActor": "forge.actors.reward",
    # configs
    "GeneratorConfig": "forge.generation.backend",
    "TrainerConfig": "forge.training.config",
    "ReferenceConfig": "forge.training.config",
    "OptimizerConfig": "forge.training.config",
    "ScheduleConfig": "forge.training.config",
    "WeightPublishConfig": "forge.training.config",
    "WeightPullConfig": "forge.generation.backend",
    "load_config": "forge.config",
    # extension points
    "PluginSpec": "forge.plugins",
    "Slot": "forge.plugins",
    "import_string": "forge.plugins",
    "RolloutManager": "forge.rollout",
    "JsonlSource": "forge.data",
    "HFSource": "forge.data",
    "dump_config": "forge.config",
    # messages
    "Completion": "forge.types",
    "Episode": "forge.types",
    "SamplingParams": "forge.types",
    "TrainBatch": "forge.types",
    # maths, rewards, data
    "LossConfig": "forge.losses",
    "build_loss": "forge.losses",
    "grpo_advantages": "forge.losses",
    "collate_episodes": "forge.replay",
    "evaluate_rewards": "forge.rewards",
    # models
    "make_tiny_model": "forge.models",
    "ensure_tiny_model": "forge.models",
    "load_model": "forge.models",
    "load_tokenizer": "forge.models",
    # observability
    "record_metric": "forge.observability",
    "Reduce": "forge.observability",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from forge.actors.generator import Generator  # noqa: F401
