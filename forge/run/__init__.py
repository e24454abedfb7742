"""The run's machinery: what every RL program needs around its loop.

An app (``apps/grpo/main.py``) spawns actors and services, then wires these into its loop:

=======================  ==============================================================
``RunConfig``            what every training app's config shares (forge.run.run_config)
``RLConfig``             the RL run's config: policy, roles, rollout, replicas, evaluation
``MetricLog``, ``M``     step metrics to backends and ``forge top``; their names
``Checkpointer``         checkpoints for ``forge run --resume``
``Supervisor``, ``Roles`` restarts from the last checkpoint when a watched actor dies
``WeightSync``           push a version, load it on the generators (beside training)
``Colocation``           one device time-sliced: the generator sleeps while the trainer steps
``ActorMetrics``         actors' metrics flushed off the critical path
``train_batch``          one step as the config asks: ``train_next`` or ``train_streamed``
``train_next``           wait for a batch (bounded), then a training step (PPO: critic)
``train_streamed``       trajectory streaming: train on episodes as they arrive
``Evaluator``            greedy held-out accuracy or episode success, logged
``check_parity``         generator against trainer logprobs before the first step
``ParityWatch``          stops a run whose on-policy mismatch stays above its bound
``sft_then_rl``          a pipeline of apps (SFT, then RL) in one run directory
=======================  ==============================================================
"""

from forge.run.actors import actor_env_vars
from forge.run.batches import next_batch, train_batch, train_next, train_streamed
from forge.run.checkpoint import Checkpointer
from forge.run.colocate import Colocation
from forge.run.evaluate import Evaluator, evaluate_policy
from forge.run.flush import ActorMetrics
from forge.run.gae_critic import GAECritic, check_ppo, train_step
from forge.run.metric_log import MetricLog, progress, progress_fields, step_row
from forge.run.parity import ParityConfig, ParityWatch, PolicyMismatchError
from forge.run.parity import check_at_start as check_parity
from forge.run.placement import PlacementConfig
from forge.run.policy import PolicyConfig, retarget
from forge.run.rl_config import EvalConfig, ReplicasConfig, RLConfig
from forge.run.run_config import RolloutRunConfig, RunConfig
from forge.run.supervise import Roles, Supervisor, TrainerDiedError, check_restarts
from forge.run.weights import WeightSync

__all__ = [
    "ActorMetrics",
    "Checkpointer",
    "Colocation",
    "EvalConfig",
    "Evaluator",
    "GAECritic",
    "MetricLog",
    "ParityConfig",
    "ParityWatch",
    "PlacementConfig",
    "PolicyConfig",
    "PolicyMismatchError",
    "RLConfig",
    "ReplicasConfig",
    "Roles",
    "RolloutRunConfig",
    "RunConfig",
    "Supervisor",
    "TrainerDiedError",
    "WeightSync",
    "actor_env_vars",
    "check_parity",
    "check_ppo",
    "check_restarts",
    "evaluate_policy",
    "next_batch",
    "progress",
    "retarget",
    "progress_fields",
    "step_row",
    "train_batch",
    "train_next",
    "train_step",
    "train_streamed",
]
