"""Forge: RL post-training for LLMs. The public API: apps and notebooks import from here
(``from forge import Generator, Trainer, RLConfig, MetricLog, ...``), and from ``controller``
for the runtime itself.

Names load lazily (PEP 562), so ``import forge`` and ``forge --help`` stay fast and pull in
torch/transformers only when a component is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # actors (everything forge.actors exports)
    **{
        name: "forge.actors"
        for name in (
            "Critic",
            "CriticConfig",
            "DatasetActor",
            "EnvActor",
            "Generator",
            "GeneratorConfig",
            "ReferenceConfig",
            "ReferenceModel",
            "ReplayBuffer",
            "ReplayBufferConfig",
            "RewardActor",
            "RewardModel",
            "RewardModelConfig",
            "Teacher",
            "Trainer",
            "TrainerConfig",
        )
    },
    # configs
    "OptimizerConfig": "forge.training.trainer_config",
    "ScheduleConfig": "forge.training.trainer_config",
    "WeightTransportConfig": "forge.weights.transport_config",
    "LossConfig": "forge.losses",
    "PhaseConfig": "forge.training.phases",
    "PhaseTracker": "forge.training.phases",
    "load_config": "forge.config",
    "dump_config": "forge.config",
    # the run's machinery (forge.run) and its metric names
    **{
        name: "forge.run"
        for name in (
            "ActorMetrics",
            "Checkpointer",
            "EvalConfig",
            "Evaluator",
            "GAECritic",
            "MetricLog",
            "ParityWatch",
            "PolicyConfig",
            "PolicyMismatchError",
            "RLConfig",
            "ReplicasConfig",
            "Roles",
            "Supervisor",
            "TrainerDiedError",
            "WeightSync",
            "actor_env_vars",
            "check_parity",
            "evaluate_policy",
            "next_batch",
            "progress",
            "progress_fields",
            "retarget",
            "step_row",
            "train_batch",
            "train_next",
            "train_step",
            "train_streamed",
        )
    },
    "policy_defaults": "forge.run.policy",
    "make_deterministic": "forge.run.run_config",
    "seed_defaults": "forge.run.run_config",
    "RunConfig": "forge.run.run_config",
    "RolloutRunConfig": "forge.run.run_config",
    "Colocation": "forge.run.colocate",
    "PlacementConfig": "forge.run.placement",
    "PipelineConfig": "forge.run.pipeline",
    "Stage": "forge.run.pipeline",
    "base_model": "forge.run.pipeline",
    "run_stage": "forge.run.pipeline",
    "sft_then_rl": "forge.run.pipeline",
    "summary": "forge.run.pipeline",
    "M": "forge.observability.names",
    "read_jsonl": "forge.observability.backends",
    # rollouts: groups, episodes, environments
    "RolloutManager": "forge.rollout",
    "RolloutConfig": "forge.rollout.scoring",
    "GroupScorer": "forge.rollout.scoring",
    "Distiller": "forge.rollout.distiller",
    "TeacherConfig": "forge.rollout.distiller",
    "Teachers": "forge.rollout.distiller",
    "spawn_teachers": "forge.run.teachers",
    "EnvConfig": "forge.rollout.episodes",
    "EpisodeScorer": "forge.rollout.episodes",
    "build_tools": "forge.rollout.episodes",
    "group_episodes": "forge.rollout",
    "Environment": "forge.envs",
    "StepResult": "forge.envs",
    "Tool": "forge.envs",
    "tool": "forge.envs",
    "HistoryWindow": "forge.envs",
    "ToolSpec": "forge.envs.tool_specs",
    # evaluation
    "EvalSet": "forge.evaluation",
    "evaluate_set": "forge.evaluation",
    "pass_at_k": "forge.evaluation",
    # environments and datasets from the ecosystem (their packages load when built)
    "ReasoningGymSource": "forge.integrations.reasoning_gym",
    "ReasoningGymReward": "forge.integrations.reasoning_gym",
    "VerifiersEnv": "forge.integrations.verifiers",
    "VerifiersSource": "forge.integrations.verifiers",
    "TextArenaEnv": "forge.integrations.textarena",
    "TextArenaSeeds": "forge.integrations.textarena",
    "OpenEnvClient": "forge.integrations.openenv",
    # extension points
    "PluginSpec": "forge.plugins",
    "Slot": "forge.plugins",
    "Spec": "forge.plugins",
    "import_string": "forge.plugins",
    **{
        name: "forge.slots"
        for name in (
            "ADVANTAGE",
            "CREDIT",
            "DATA_SOURCE",
            "ENVIRONMENT",
            "GROUP_FILTER",
            "KL",
            "LOSS",
            "REFERENCE_UPDATE",
            "REWARD",
            "REWARD_AGGREGATOR",
        )
    },
    "JsonlSource": "forge.data",
    "HFSource": "forge.data",
    "sft_batch": "forge.data.sft",
    # messages
    "Completion": "forge.types",
    "Episode": "forge.types",
    "SamplingParams": "forge.types",
    "TrainBatch": "forge.types",
    # maths, rewards, data
    "build_loss": "forge.losses",
    "grpo_advantages": "forge.losses",
    "collate_episodes": "forge.replay",
    "evaluate_rewards": "forge.rewards",
    # models
    "make_tiny_model": "forge.models",
    "ensure_tiny_model": "forge.models",
    "load_model": "forge.models",
    "load_tokenizer": "forge.models",
    "resolve_model": "forge.models.gguf",
    "extract_final_answer": "forge.rewards",
    "HFEngine": "forge.generation.hf_engine",
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


# Every lazy name, for type checkers and editors (PEP 562's ``__getattr__`` is opaque to
# them): ``from forge import Trainer`` then resolves, and "go to definition" works.
# tests/unit/test_public_api.py checks this block names exactly ``_EXPORTS``, each from its
# module.
if TYPE_CHECKING:  # pragma: no cover - never runs
    from forge.actors import (
        Critic,
        CriticConfig,
        DatasetActor,
        EnvActor,
        Generator,
        GeneratorConfig,
        ReferenceConfig,
        ReferenceModel,
        ReplayBuffer,
        ReplayBufferConfig,
        RewardActor,
        RewardModel,
        RewardModelConfig,
        Teacher,
        Trainer,
        TrainerConfig,
    )
    from forge.config import dump_config, load_config
    from forge.data import HFSource, JsonlSource
    from forge.data.sft import sft_batch
    from forge.envs import Environment, HistoryWindow, StepResult, Tool, tool
    from forge.envs.tool_specs import ToolSpec
    from forge.evaluation import EvalSet, evaluate_set, pass_at_k
    from forge.generation.hf_engine import HFEngine
    from forge.integrations.openenv import OpenEnvClient
    from forge.integrations.reasoning_gym import ReasoningGymReward, ReasoningGymSource
    from forge.integrations.textarena import TextArenaEnv, TextArenaSeeds
    from forge.integrations.verifiers import VerifiersEnv, VerifiersSource
    from forge.losses import LossConfig, build_loss, grpo_advantages
    from forge.models import ensure_tiny_model, load_model, load_tokenizer, make_tiny_model
    from forge.models.gguf import resolve_model
    from forge.observability import Reduce, record_metric
    from forge.observability.backends import read_jsonl
    from forge.observability.names import M
    from forge.plugins import PluginSpec, Slot, Spec, import_string
    from forge.replay import collate_episodes
    from forge.rewards import evaluate_rewards, extract_final_answer
    from forge.rollout import RolloutManager, group_episodes
    from forge.rollout.distiller import Distiller, TeacherConfig, Teachers
    from forge.rollout.episodes import EnvConfig, EpisodeScorer, build_tools
    from forge.rollout.scoring import GroupScorer, RolloutConfig
    from forge.run import (
        ActorMetrics,
        Checkpointer,
        EvalConfig,
        Evaluator,
        GAECritic,
        MetricLog,
        ParityWatch,
        PolicyConfig,
        PolicyMismatchError,
        ReplicasConfig,
        RLConfig,
        Roles,
        Supervisor,
        TrainerDiedError,
        WeightSync,
        actor_env_vars,
        check_parity,
        evaluate_policy,
        next_batch,
        progress,
        progress_fields,
        retarget,
        step_row,
        train_batch,
        train_next,
        train_step,
        train_streamed,
    )
    from forge.run.colocate import Colocation
    from forge.run.pipeline import (
        PipelineConfig,
        Stage,
        base_model,
        run_stage,
        sft_then_rl,
        summary,
    )
    from forge.run.placement import PlacementConfig
    from forge.run.policy import policy_defaults
    from forge.run.run_config import (
        RolloutRunConfig,
        RunConfig,
        make_deterministic,
        seed_defaults,
    )
    from forge.run.teachers import spawn_teachers
    from forge.slots import (
        ADVANTAGE,
        CREDIT,
        DATA_SOURCE,
        ENVIRONMENT,
        GROUP_FILTER,
        KL,
        LOSS,
        REFERENCE_UPDATE,
        REWARD,
        REWARD_AGGREGATOR,
    )
    from forge.training.phases import PhaseConfig, PhaseTracker
    from forge.training.trainer_config import OptimizerConfig, ScheduleConfig
    from forge.types import Completion, Episode, SamplingParams, TrainBatch
    from forge.weights.transport_config import WeightTransportConfig
