"""The config of an RL run (the GRPO app's): everything an RL loop may read, each fact
stated once.

``RLConfig`` extends the shared ``RolloutRunConfig`` (``forge.run.run_config``: policy,
trainer, generator, data, rewards, rollout, replicas, evaluation) with what the GRPO loop
reads besides: a reference policy, a critic, an environment, a reward model, phases,
checkpoints and restarts, streaming. YAML is its surface (``forge run --config X.yaml
a.b=c``); every choice is resolved when the config loads, and knobs the run would ignore are
errors, never silent no-ops.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from forge.models.reward_classifier import RewardModelConfig
from forge.plugins import PluginSpec
from forge.rollout.distiller import TeacherConfig
from forge.rollout.episodes import EnvConfig
from forge.rollout.scoring import RolloutConfig, check_rollout_overrides, per_episode, per_member
from forge.run.gae_critic import check_ppo
from forge.run.parity import ParityConfig
from forge.run.placement import PlacementConfig, check_placement, disjoint_gpus, gpu_count
from forge.run.run_config import (
    DETERMINISTIC,
    RENAMED,
    SEEDED_ROLES,
    EvalConfig,
    ReplicasConfig,
    RolloutRunConfig,
    RunConfig,
    check_sampling,
    make_deterministic,
    seed_defaults,
)
from forge.run.supervise import check_restarts
from forge.run.teacher_checks import check_teacher, teacher_reference
from forge.training.phases import PhaseConfig, resolve_phases, validate_phases
from forge.training.trainer_config import ReferenceConfig, check_gspo, check_tis
from forge.training.value_model import CriticConfig

__all__ = [
    "DETERMINISTIC",
    "RENAMED",
    "SEEDED_ROLES",
    "EvalConfig",
    "RLConfig",
    "ReplicasConfig",
    "RolloutRunConfig",
    "RunConfig",
    "check_sampling",
    "make_deterministic",
    "seed_defaults",
]

# The advantages that are relative to the group (0 for a group of one).
GROUP_RELATIVE = ("grpo", "dr_grpo", "rloo")
GROUP_RELATIVE_FNS = ("grpo_advantages", "dr_grpo_advantages", "rloo_advantages")


@dataclass(kw_only=True)
class RLConfig(RolloutRunConfig):
    """An RL run's config (the GRPO app's): the shared ``RolloutRunConfig`` plus a reference
    policy, a critic, an environment, a reward model, phases, checkpoints, restarts and
    streaming."""

    max_policy_age: int = 1
    """Rollouts run at most this many policy versions ahead of training (0: on-policy)."""
    trainer_procs: int = 1
    """Trainer processes (data parallel; ``trainer.parallelism`` says how they share)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """GPU sharing between the generator and the trainer: memory shares, time-sliced
    colocation (``forge.run.placement``, docs/gpus.md)."""
    reference: ReferenceConfig | None = None
    """The reference policy of a KL term (``None``: no reference)."""
    teacher: TeacherConfig | None = None
    """On-policy distillation: a teacher whose per-token reverse KL to the policy's samples
    joins the advantages (``None``: no teacher; docs/distillation.md)."""
    env: EnvConfig | None = None
    """Multi-turn: rollouts are episodes in this environment (``None``: single-turn)."""
    reward_model: RewardModelConfig | None = None
    """A learned reward model; its score is a reward component."""
    critic: CriticConfig | None = None
    """PPO: a value model giving GAE advantages per token (or per turn)."""
    whiten_advantages: bool = True
    """With a critic: normalise GAE advantages per batch."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """Loss and rollout settings that switch at given steps (``forge.training.phases``)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: never)."""
    checkpoint_keep_last: int = 2
    """Keep the newest this many checkpoints, removing older ones after each save (0: keep
    every one)."""
    restart_on_failure: int = 0
    """Restarts from the last checkpoint if the trainer dies (needs ``checkpoint_every``)."""
    stream: bool = False
    """Trajectory streaming: train on a step's first groups while the rest are sampled."""
    batch_timeout_s: float = 600.0
    """No usable batch for this long: the run stops with a named error."""
    parity: ParityConfig = field(default_factory=ParityConfig)
    """The generator's logprobs against the trainer's on the same tokens: checked before the
    first step, watched on-policy after it (``forge.run.parity``)."""
    policy_roles: ClassVar[tuple[str, ...]] = ("generator", "trainer", "reference", "critic")
    # Whether the app's advantages are rollout.advantage's, relative to each prompt's group
    # (GroupScorer). An app that computes its own (a running baseline) sets False.
    group_advantages: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()  # data, rewards, policy, LoRA, weights, sampling
        self._place()
        self._check_broadcast()
        self._check_push_dtype()
        check_ppo(self.critic, self.trainer.loss.type)
        self._check_credit()
        validate_phases(self.phases, self.trainer.loss)
        check_rollout_overrides(self.phases)
        self._check_groups(self.rollout, "rollout")
        for phase in resolve_phases(self.phases, self.trainer.loss):
            check_tis(phase.loss, self.trainer.old_logprobs, key=f"phases[{phase.index}].loss")
            check_gspo(phase.loss, self.trainer.old_logprobs, key=f"phases[{phase.index}].loss")
            rollout = dataclasses.replace(self.rollout, **phase.rollout)
            self._check_groups(rollout, f"phases[{phase.index}].rollout")
        check_restarts(self.restart_on_failure, self.checkpoint_every)
        if self.checkpoint_keep_last < 0:
            raise ValueError(
                f"checkpoint_keep_last must be >= 0 (0: keep every checkpoint), got "
                f"{self.checkpoint_keep_last}"
            )
        self._check_env()
        check_teacher(self)
        if self.stream and (self.trainer_procs != 1 or self.critic is not None):
            raise ValueError(
                "stream: trajectory streaming needs trainer_procs=1 and no critic (PPO values "
                f"need the whole batch); got trainer_procs={self.trainer_procs}, "
                f"critic={'set' if self.critic else 'none'}; set stream=false"
            )
        if self.rollout.episodes_per_step % self.trainer_procs:
            raise ValueError(
                f"rollout.prompts_per_step*group_size={self.rollout.episodes_per_step} must "
                f"divide by trainer_procs={self.trainer_procs}"
            )

    def _reference(self) -> ReferenceConfig | None:
        return self.reference

    def _env(self) -> EnvConfig | None:
        return self.env

    def _teacher(self) -> TeacherConfig | None:
        return self.teacher

    def _place(self) -> None:
        """``placement:`` checked against the GPUs visible here; its memory shares then flow
        to the generator and trainer configs (``forge.run.placement``)."""
        p, gen, trainer = self.placement, self.generator, self.trainer
        gen_gpu = gen.backend == "vllm" or gen.device.startswith("cuda")
        trainer_gpu = trainer.device == "cuda" or (trainer.device == "auto" and gpu_count() > 0)
        check_placement(
            p,
            generator_gpu=gen_gpu,
            trainer_gpu=trainer_gpu,
            generators=self.replicas.generator,
            trainer_procs=self.trainer_procs,
            max_policy_age=self.max_policy_age,
            stream=self.stream,
            visible=gpu_count() if gen_gpu or trainer_gpu else 0,
        )
        if p.colocate and p.sleep_level == 2 and trainer.lora is not None:
            raise ValueError(
                "placement.sleep_level 2 frees the generator's weights while it sleeps, but a "
                "LoRA policy pushes only its adapter (applied to the base the generator "
                "keeps); set placement.sleep_level: 1"
            )
        if p.shared and gen_gpu and trainer.weights.type == "broadcast":
            raise ValueError(
                f"placement {p.mode} puts the generator and trainer on one GPU, where NCCL "
                "cannot broadcast between them (one rank per device); use weights type shm"
            )
        for role, share in (("generator", p.generator_memory), ("trainer", p.trainer_memory)):
            cfg = getattr(self, role)
            if share and cfg.memory_fraction and cfg.memory_fraction != share:
                raise ValueError(
                    f"{role}.memory_fraction={cfg.memory_fraction} and placement.{role}_memory="
                    f"{share} state one fact twice; keep placement.{role}_memory"
                )
            cfg.memory_fraction = share or cfg.memory_fraction
        gen._check_memory_fraction()  # (e.g. against engine_kwargs.gpu_memory_utilization)
        if p.colocate and gen.backend == "vllm":
            if gen.engine_kwargs.get("enable_sleep_mode") is False:
                raise ValueError(
                    "placement.colocate needs vLLM's sleep mode; remove "
                    "generator.engine_kwargs.enable_sleep_mode: false"
                )
            gen.engine_kwargs = {**gen.engine_kwargs, "enable_sleep_mode": True}

    def gpu_options(self, role: str) -> dict[str, Any]:
        """Extra ``Actor.options`` for ``role`` (``generator`` or ``trainer``): under disjoint
        placement, with enough GPUs visible, a GPU role's processes get GPUs of their own (the
        GPU provisioner, ``with_gpus``); otherwise they see every GPU (generator on GPU 0,
        trainer rank r on GPU r). Nothing on a machine without GPUs."""
        gpu = {
            "generator_gpu": self.generator.backend == "vllm" or self.generator.device != "cpu",
            "trainer_gpu": self.trainer.device != "cpu",
        }
        own = disjoint_gpus(
            **gpu,
            generators=self.replicas.generator,
            trainer_procs=self.trainer_procs,
            visible=gpu_count(),
        )
        if self.placement.shared or not gpu[f"{role}_gpu"] or not own:
            return {}
        from controller import env_vars

        return {} if env_vars.backend() == "monarch" else {"with_gpus": True}

    def _check_credit(self) -> None:
        """Credit over turns needs turns (an env), a loss that takes per-token advantages,
        and no critic (which then gives the advantages); a critic over turns needs an env."""
        level = self.critic.level if self.critic is not None else "token"
        if level == "turn" and self.env is None:
            raise ValueError("critic.level=turn needs an env section (turns to credit)")
        if per_episode(self.rollout.credit) and level == "token":
            return
        if not per_member(self.rollout.reward_aggregator):
            raise ValueError(
                "rollout.credit / critic.level=turn split rewards by turn, which needs a "
                "per-member reward aggregator (weighted_sum); got rollout.reward_aggregator="
                f"{self.rollout.reward_aggregator!r}"
            )
        if per_episode(self.rollout.credit):
            return
        what = "rollout.credit gives each turn its own advantage"
        if self.env is None:
            raise ValueError(f"{what}, but there is no env section (single-turn): remove it")
        if self.critic is not None:
            raise ValueError(
                f"{what}, but a critic is set and its GAE gives the advantages; use "
                "critic.level=turn for PPO over turns, or remove one of them"
            )
        if self.trainer.loss.type == "gspo":
            raise ValueError(
                f"{what} (per token), but trainer.loss.type=gspo takes one per sequence; "
                "use grpo, ppo or reinforce"
            )

    def _check_groups(self, rollout: RolloutConfig, key: str) -> None:
        """A group-relative advantage of a group of one is always 0: without a critic (which
        gives the advantages instead) or credit over turns, nothing would be learned."""
        name = rollout.advantage.fn if isinstance(rollout.advantage, PluginSpec) else None
        name = name or (rollout.advantage if isinstance(rollout.advantage, str) else "")
        relative = name in GROUP_RELATIVE or name.split(":")[-1] in GROUP_RELATIVE_FNS
        if (
            self.group_advantages
            and rollout.group_size == 1
            and relative
            and self.critic is None
            and self.teacher is None  # the teacher's per-token term needs no group
            and per_episode(rollout.credit)
        ):
            raise ValueError(
                f"{key}.group_size=1 with {key}.advantage={name!r}: a group-relative advantage "
                "compares a completion with the other completions of its prompt, and a group "
                "of one has none, so every advantage is 0 and nothing is learned. Set "
                "group_size >= 2, or add a critic section (PPO, GAE advantages)"
            )

    def _check_broadcast(self) -> None:
        if self.trainer.weights.type != "broadcast":
            return
        if self.reference is not None and self.reference.update.type != "none":
            raise ValueError(
                f"weights type broadcast sends versions to the generators only, but "
                f"reference.update.type={self.reference.update.type!r} needs the reference to "
                "pull them too; use weights type shm, or reference.update.type: none"
            )
        if self.trainer.lora is not None:
            raise ValueError(
                "weights type broadcast sends whole models; a LoRA policy pushes adapters "
                "(a few MB): use weights type shm with trainer.lora"
            )

    def _check_push_dtype(self) -> None:
        """Pushes in a narrower type (``trainer.weights.dtype``) round every version the
        pullers compute with, so each puller must compute in that type already; otherwise the
        knob would silently give it a different model from the trainer's."""
        push = self.trainer.weights.dtype
        if not push:
            return
        pullers = [("generator.dtype", self.generator.dtype)]
        if self.reference is not None and self.reference.update.type != "none":
            pullers.append(("reference.dtype", self.reference.dtype))
        if push == "auto":  # bf16 where the trainer's host has it: pullers may compute in it
            wrong = [f"{k}={d!r}" for k, d in pullers if d not in ("auto", "bfloat16")]
            if wrong:
                raise ValueError(
                    f"trainer.weights.dtype=auto pushes bfloat16 where the trainer's device "
                    f"multiplies it natively, but {' and '.join(wrong)} would then compute "
                    "with the rounded values, a different model from the trainer's; set "
                    f"{' and '.join(k for k, _ in pullers)} to auto (each decides on its own "
                    "host), or set trainer.weights.dtype explicitly"
                )
            return
        wrong = [f"{key}={dtype!r}" for key, dtype in pullers if dtype != push]
        if wrong:
            raise ValueError(
                f"trainer.weights.dtype={push!r} rounds every pushed version to {push}, but "
                f"{' and '.join(wrong)} would compute with the rounded values, a different "
                f"model from the trainer's; set {' and '.join(k for k, _ in pullers)} to "
                f"{push!r}, or remove trainer.weights.dtype"
            )

    def _check_env(self) -> None:
        """With an environment, it scores episodes and ``rewards`` add components scored on
        each final answer; the other knobs of single-turn scoring would be ignored: errors.
        (Without one, ``RolloutRunConfig`` checks that rewards score completions.)"""
        if self.env is None:
            return
        turn_critic = self.critic is not None and self.critic.level == "turn"
        if self.env.history is not None and self.critic is not None:
            if self.critic.level != "turn" or self.critic.bootstrap_truncated:
                raise ValueError(
                    "env.history makes each turn its own training row; a critic then needs "
                    "critic.level=turn (GAE across an episode's rows) without "
                    "bootstrap_truncated (the state after the last turn is in no row); got "
                    f"level={self.critic.level!r}, "
                    f"bootstrap_truncated={self.critic.bootstrap_truncated}"
                )
        if self.rewards and (not per_episode(self.rollout.credit) or turn_critic):
            raise ValueError(
                "rewards: with env, reward functions score each episode's final answer (one "
                "number per episode), which credit over turns (rollout.credit) and a turn-level "
                "critic cannot place on a turn; give those rewards from the environment's step()"
            )
        ignored = {
            "reward_model": self.reward_model is not None,
            "eval.reward": self.eval.reward is not None,
            "rollout.overlong_buffer": bool(self.rollout.overlong_buffer),
        }
        named = [k for k, v in ignored.items() if v]
        if named:
            raise ValueError(
                f"{', '.join(named)}: set together with env, but the environment gives every "
                "reward of an episode (its named components are the reward components); "
                "score inside the environment's step() instead, or remove them"
            )

    @property
    def reference_service(self) -> ReferenceConfig | None:
        """The reference to run as a ``ReferenceModel`` service: ``None`` without one or when
        the trainer computes it (LoRA, ``reference.mode=adapter_disabled``)."""
        ref = self.reference
        return ref if ref is not None and ref.mode == "separate" else None

    @property
    def teacher_service(self) -> ReferenceConfig | None:
        """The ``ReferenceConfig`` the ``Teacher`` service loads (``None``: no teacher)."""
        return teacher_reference(self)
