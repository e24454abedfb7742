"""The config of an RL run: what every RL app's loop needs, each fact stated once.

An app's ``Config`` is (or extends) ``RLConfig``; YAML is its surface (``forge run --config
X.yaml a.b=c``). The policy's facts (``policy:``, see ``forge.run.policy``) flow to the
generator, trainer, reference, critic and evaluation; replica counts are one section
(``replicas:``); every choice is resolved when the config loads, and knobs the run would
ignore are errors, never silent no-ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from forge.evaluation.sets import EvalSet
from forge.generation.backend import GeneratorConfig
from forge.models.reward_model import RewardModelConfig
from forge.plugins import PluginSpec, Spec
from forge.rollout.episodes import EnvConfig
from forge.rollout.scoring import (
    RolloutConfig,
    check_rollout_overrides,
    per_episode,
    per_member,
)
from forge.run.critic import check_ppo
from forge.run.placement import PlacementConfig, check_placement, disjoint_gpus, gpu_count
from forge.run.policy import PolicyConfig, check_policy, policy_defaults, resolve_lora
from forge.run.supervise import check_restarts
from forge.slots import DATA_SOURCE, REWARD
from forge.training.config import ReferenceConfig, TrainerConfig, check_tis
from forge.training.critic import CriticConfig
from forge.training.phases import PhaseConfig, resolve_phases, validate_phases
from forge.weights.config import WeightTransportConfig

__all__ = ["EvalConfig", "RLConfig", "ReplicasConfig", "check_sampling", "make_deterministic"]

# The advantages that are relative to the group (0 for a group of one).
GROUP_RELATIVE = ("grpo", "dr_grpo", "rloo")
GROUP_RELATIVE_FNS = ("grpo_advantages", "dr_grpo_advantages", "rloo_advantages")


def check_sampling(generator: GeneratorConfig) -> None:
    """Refuse top-p / top-k sampling when a trainer consumes the samples.

    The two generator backends report different logprobs under filtering: the hf backend the
    unfiltered ``log_softmax(logits / T)`` (what the trainer recomputes), vLLM its
    ``processed_logprobs``, renormalised over the kept tokens (no vLLM logprobs mode gives
    the tempered, unfiltered distribution). The same config would train differently on the
    two, and under vLLM every kept token's logprob is inflated by ``-log(kept mass)``, so
    the ratio sits below 1 and a negative-advantage token gets zero gradient wherever the
    kept mass is below ``1 - clip_eps_low``. Sampling from a truncated distribution while
    the loss assumes the full one is off-policy in any case.
    """
    s = generator.sampling
    if s.top_p < 1.0 or s.top_k > 0:
        raise ValueError(
            f"generator.sampling top_p={s.top_p}, top_k={s.top_k}: an RL run trains on "
            "these samples, and under top-p/top-k the hf backend reports unfiltered logprobs "
            "while vLLM reports logprobs renormalised over the kept tokens, so the policy "
            "ratio (and TIS, KL) would depend on the backend and be biased under vLLM. Use "
            "top_p: 1.0 and top_k: 0 for training rollouts (lower policy.temperature to "
            "sharpen sampling instead); see docs/rl_maths.md"
        )


# Keys of earlier versions, and where their fact lives now.
RENAMED = {
    "model": "policy.model",
    "rollout.temperature": "policy.temperature",
    "num_generators": "replicas.generator",
    "reward_replicas": "replicas.rewards",
    "reward_model_replicas": "replicas.reward_model",
    "env.replicas": "replicas.env",
}


@dataclass
class EvalConfig:
    """Greedy evaluation on the data source's held-out items: before training (``at_start``),
    after it (``at_end``) and every ``every`` steps (0: never). ``reward`` scores held-out
    answers (default: the first of ``rewards``); with an environment, its success decides.
    ``sets``: named evaluation sets evaluated at the same times (``forge.evaluation``:
    other sources, environments, ``n`` samples for pass@k); ``forge eval`` runs them on a
    saved policy."""

    at_start: bool = True
    at_end: bool = True
    every: int = 0
    max_tokens: int = 8
    reward: Spec | None = None
    sets: list[EvalSet] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = [s.name for s in self.sets]
        if len(set(names)) < len(names):
            raise ValueError(f"eval.sets: names must be unique, got {names}")


@dataclass
class ReplicasConfig:
    """How many replicas each service runs. ``env: 0`` runs environments in the rollout
    loop's own process; N > 0 runs them in an ``EnvActor`` service."""

    generator: int = 1
    rewards: int = 1
    reward_model: int = 1
    env: int = 0

    def __post_init__(self) -> None:
        for name in ("generator", "rewards", "reward_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"replicas.{name} must be >= 1, got {getattr(self, name)}")
        if self.env < 0:
            raise ValueError(f"replicas.env must be >= 0 (0: in-process), got {self.env}")


@dataclass
class RLConfig:
    """See the module docstring; fields are documented where they are less than obvious."""

    app: str
    policy: PolicyConfig
    generator: GeneratorConfig
    trainer: TrainerConfig
    data: Spec
    rewards: list[Spec] = field(default_factory=list)  # with env: scored on final answers
    steps: int = 100
    max_policy_age: int = 1  # rollouts run at most this many versions ahead of training
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    trainer_procs: int = 1
    placement: PlacementConfig = field(default_factory=PlacementConfig)  # GPU sharing
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)  # all roles
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reference: ReferenceConfig | None = None  # a KL term's reference policy
    env: EnvConfig | None = None  # multi-turn: rollouts are episodes in this environment
    reward_model: RewardModelConfig | None = None  # a learned reward: its score is a component
    critic: CriticConfig | None = None  # PPO: a value model, GAE advantages per token
    whiten_advantages: bool = True  # with a critic: normalise GAE advantages per batch
    eval: EvalConfig = field(default_factory=EvalConfig)
    phases: list[PhaseConfig] = field(default_factory=list)  # loss/rollout switches by step
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    checkpoint_every: int = 0
    restart_on_failure: int = 0  # restarts from the last checkpoint if the trainer dies
    stream: bool = False  # trajectory streaming: train on a step's first groups early
    batch_timeout_s: float = 600.0  # no usable batch for this long: stop with a named error
    threads_per_actor: int = 0  # 0: the host thread budget (controller.threads); N: fixed
    seed: int = 0
    deterministic: bool = False  # same config and seed, same numbers (slower; see below)
    # Whether the app's advantages are rollout.advantage's, relative to each prompt's group
    # (GroupScorer). An app that computes its own (a running baseline) sets False.
    group_advantages: ClassVar[bool] = True

    @classmethod
    def __config_prepare__(cls, data: dict[str, Any]) -> dict[str, Any]:
        for old, new in RENAMED.items():
            section, _, key = old.rpartition(".")
            holder = data.get(section) if section else data
            if isinstance(holder, dict) and key in holder:
                raise ValueError(f"{old} is now {new} (each fact is stated once); rename it")
        data = policy_defaults(data, ("generator", "trainer", "reference", "critic"))
        if isinstance(data.get("weights"), dict):  # one transport: the pusher's and pullers'
            for role in ("generator", "trainer", "reference"):
                if isinstance(data.get(role), dict):
                    data[role] = {"weights": data["weights"], **data[role]}
        return data

    def __post_init__(self) -> None:
        if self.deterministic:
            make_deterministic(self)
        # Resolve every user-supplied part now: a typo fails before anything spawns.
        DATA_SOURCE.validate(self.data, key="data")
        for i, spec in enumerate(self.rewards):
            REWARD.validate(spec, key=f"rewards[{i}]")
        if self.eval.reward is not None:
            REWARD.validate(self.eval.reward, key="eval.reward")
        check_policy(self.policy, generator=self.generator, trainer=self.trainer,
                     reference=self.reference)  # fmt: skip
        resolve_lora(self.trainer, self.generator, self.reference)
        self._place()
        for name, role in (("generator", self.generator), ("reference", self.reference)):
            if role is not None and _where(role.weights) != _where(self.trainer.weights):
                raise ValueError(
                    f"{name}.weights pulls from {_where(role.weights)} but trainer.weights "
                    f"pushes to {_where(self.trainer.weights)}; state the transport once in "
                    "the run's weights: section"
                )
        self._check_broadcast()
        check_ppo(self.critic, self.trainer.loss.type)
        self._check_credit()
        validate_phases(self.phases, self.trainer.loss)
        check_rollout_overrides(self.phases)
        check_sampling(self.generator)
        self._check_groups(self.rollout, "rollout")
        for phase in resolve_phases(self.phases, self.trainer.loss):
            check_tis(phase.loss, self.trainer.old_logprobs, key=f"phases[{phase.index}].loss")
            rollout = dataclasses.replace(self.rollout, **phase.rollout)
            self._check_groups(rollout, f"phases[{phase.index}].rollout")
        check_restarts(self.restart_on_failure, self.checkpoint_every)
        self._check_env()
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

    def _place(self) -> None:
        """``placement:`` checked against the GPUs visible here; its memory shares then flow
        to the generator and trainer configs (``forge.run.placement``)."""
        p, gen, trainer = self.placement, self.generator, self.trainer
        gen_gpu = gen.backend == "vllm" or gen.device.startswith("cuda")
        trainer_gpu = trainer.device == "cuda" or (trainer.device == "auto" and gpu_count() > 0)
        check_placement(p, generator_gpu=gen_gpu, trainer_gpu=trainer_gpu,
                        generators=self.replicas.generator, trainer_procs=self.trainer_procs,
                        max_policy_age=self.max_policy_age, stream=self.stream,
                        visible=gpu_count() if gen_gpu or trainer_gpu else 0)  # fmt: skip
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
                raise ValueError("placement.colocate needs vLLM's sleep mode; remove "
                                 "generator.engine_kwargs.enable_sleep_mode: false")  # fmt: skip
            gen.engine_kwargs = {**gen.engine_kwargs, "enable_sleep_mode": True}

    def gpu_options(self, role: str) -> dict[str, Any]:
        """Extra ``Actor.options`` for ``role`` (``generator`` or ``trainer``): under disjoint
        placement, with enough GPUs visible, a GPU role's processes get GPUs of their own (the
        GPU provisioner, ``with_gpus``); otherwise they see every GPU (generator on GPU 0,
        trainer rank r on GPU r). Nothing on a machine without GPUs."""
        gpu = {"generator_gpu": self.generator.backend == "vllm" or self.generator.device != "cpu",
               "trainer_gpu": self.trainer.device != "cpu"}  # fmt: skip
        own = disjoint_gpus(**gpu, generators=self.replicas.generator,
                            trainer_procs=self.trainer_procs, visible=gpu_count())  # fmt: skip
        if self.placement.shared or not gpu[f"{role}_gpu"] or not own:
            return {}
        from controller import env

        return {} if env.backend() == "monarch" else {"with_gpus": True}

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

    def _check_env(self) -> None:
        """Without an environment, rewards score completions; with one, the environment
        scores episodes and ``rewards`` add components scored on each final answer; the
        other knobs of single-turn scoring would be ignored: errors."""
        if self.env is None:
            if not self.rewards:
                raise ValueError(
                    f"rewards: give at least one reward function (or an env); built-ins: "
                    f"{', '.join(REWARD.names())}"
                )
            if self.replicas.env:
                raise ValueError(f"replicas.env={self.replicas.env} but there is no env section")
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

    def reward_fns(self) -> list[Callable]:
        """The resolved reward functions."""
        return [REWARD.resolve(s) for s in self.rewards]

    def eval_reward_fn(self) -> Callable | None:
        """The reward that scores held-out answers (``None`` with an environment)."""
        if self.env is not None:
            return None
        return REWARD.resolve(self.eval.reward or self.rewards[0])


DETERMINISTIC = {  # what a deterministic run changes, and why
    "threads_per_actor": (lambda v: v or 1, "fixed thread counts: float sums in one order"),
    "max_policy_age": (lambda v: 0, "on-policy: no race between rollouts and weight pushes"),
    "rollout.tasks": (lambda v: 1, "one rollout loop: requests reach the generator in order"),
    "stream": (lambda v: False, "whole batches: parts do not depend on arrival times"),
}


def make_deterministic(cfg: Any) -> list[str]:
    """Set what ``deterministic: true`` needs (``DETERMINISTIC``) on a run config and say
    what changed on stdout; returns the changes. Actors then run with torch's deterministic
    kernels and a fixed hash seed (``forge.run.actor_env``). The same config and seed on the
    same machine then give the same metrics (times aside); it is slower."""
    changes = []
    for key, (rule, why) in DETERMINISTIC.items():
        holder, _, name = key.rpartition(".")
        obj = getattr(cfg, holder, None) if holder else cfg
        if not hasattr(obj, name):
            continue
        old = getattr(obj, name)
        new = rule(old)
        if new != old:
            setattr(obj, name, new)
            changes.append(f"{key}: {old} -> {new} ({why})")
    if changes:
        print(f"[forge] deterministic: {'; '.join(changes)}", flush=True)
    return changes


def _where(w: WeightTransportConfig) -> tuple[str, str, str]:
    """Where a transport's versions live (what pusher and pullers must agree on)."""
    return (w.type, w.prefix, w.root)
