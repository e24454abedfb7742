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
from forge.run.policy import PolicyConfig, check_policy, policy_defaults, resolve_lora
from forge.run.supervise import check_restarts
from forge.slots import DATA_SOURCE, REWARD
from forge.training.config import ReferenceConfig, TrainerConfig, check_tis
from forge.training.critic import CriticConfig
from forge.training.phases import PhaseConfig, resolve_phases, validate_phases
from forge.weights.config import WeightTransportConfig

__all__ = [
    "EvalConfig",
    "RLConfig",
    "ReplicasConfig",
    "check_sampling",
    "make_deterministic",
    "seed_defaults",
]

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


# The roles whose config has a ``seed`` of its own; each gets the run's seed.
SEEDED_ROLES = ("generator", "trainer", "critic")


def seed_defaults(data: dict[str, Any], roles: tuple[str, ...]) -> dict[str, Any]:
    """A run section's plain data with the run's ``seed`` (default 0) handed to each role
    section of ``roles`` present in it: one ``seed`` derives every role's seed.

    The derivation is the identity: every role's seed *is* the run's seed (the trainer
    seeds torch with it, the generator its sampling streams, the critic its value head, the
    replay buffer its ``random.Random``, and a pipeline hands it to every stage). The roles
    draw from unrelated generators, so one number correlates nothing, and a run at seed 0
    keeps the numbers it had when each role defaulted to 0. A role that states its own seed
    must state the run's (what a written ``config.yaml`` holds); any other value is a
    ``ValueError`` naming the fix, since two seeds for one run is a fact stated twice.
    """
    seed = data.get("seed", 0)
    out = dict(data)
    for role in roles:
        section = out.get(role)
        if not isinstance(section, dict):
            continue
        if "seed" in section and section["seed"] != seed:
            raise ValueError(
                f"{role}.seed={section['seed']!r} but seed={seed!r}: every role's seed is the "
                f"run's seed (forge.run.config.seed_defaults); remove {role}.seed and set seed"
            )
        out[role] = {**section, "seed": seed}
    return out


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
    """Greedy evaluation on the data source's held-out items: before training, after it and
    every ``every`` steps; ``forge eval`` runs the same ``sets`` on a saved policy."""

    at_start: bool = True
    """Evaluate before the first training step."""
    at_end: bool = True
    """Evaluate after the last training step."""
    every: int = 0
    """Also evaluate every this many steps (0: never)."""
    max_tokens: int = 8
    """Tokens per held-out completion (or turn)."""
    reward: Spec | None = None
    """The reward that scores held-out answers (default: the first of ``rewards``); with an
    environment, its success decides and this must be unset."""
    sets: list[EvalSet] = field(default_factory=list)
    """Named evaluation sets evaluated at the same times (``forge.evaluation``: other
    sources, environments, ``n`` samples for pass@k)."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.sets]
        if len(set(names)) < len(names):
            raise ValueError(f"eval.sets: names must be unique, got {names}")


@dataclass
class ReplicasConfig:
    """How many replicas each service runs."""

    generator: int = 1
    """Generator replicas (each its own process and engine)."""
    rewards: int = 1
    """Reward-function service replicas."""
    reward_model: int = 1
    """Reward-model service replicas (with a ``reward_model`` section)."""
    env: int = 0
    """Environment replicas: 0 runs environments in the rollout loop's own process; N > 0 in
    an ``EnvActor`` service of N replicas."""

    def __post_init__(self) -> None:
        for name in ("generator", "rewards", "reward_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"replicas.{name} must be >= 1, got {getattr(self, name)}")
        if self.env < 0:
            raise ValueError(f"replicas.env must be >= 0 (0: in-process), got {self.env}")


@dataclass
class RLConfig:
    """The config of an RL run (see the module docstring)."""

    app: str
    """The app module that runs this config (e.g. ``apps.grpo.main``)."""
    policy: PolicyConfig
    """The policy's model and sampling temperature, stated once for every role."""
    generator: GeneratorConfig
    """The generator service (its model and temperature follow ``policy``)."""
    trainer: TrainerConfig
    """The trainer (its model and temperature follow ``policy``)."""
    data: Spec
    """The data source of prompts (``forge.slots.DATA_SOURCE``: a built-in name or an import
    string, with ``kwargs``)."""
    rewards: list[Spec] = field(default_factory=list)
    """Reward functions (``forge.slots.REWARD``); with an ``env``, they score each episode's
    final answer."""
    steps: int = 100
    """Training steps."""
    max_policy_age: int = 1
    """Rollouts run at most this many policy versions ahead of training (0: on-policy)."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """How many replicas each service runs."""
    trainer_procs: int = 1
    """Trainer processes (data parallel; ``trainer.parallelism`` says how they share)."""
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    """The weight transport, stated once for the trainer (pusher) and every puller."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How groups are generated, scored and filtered."""
    reference: ReferenceConfig | None = None
    """The reference policy of a KL term (``None``: no reference)."""
    env: EnvConfig | None = None
    """Multi-turn: rollouts are episodes in this environment (``None``: single-turn)."""
    reward_model: RewardModelConfig | None = None
    """A learned reward model; its score is a reward component."""
    critic: CriticConfig | None = None
    """PPO: a value model giving GAE advantages per token (or per turn)."""
    whiten_advantages: bool = True
    """With a critic: normalise GAE advantages per batch."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation: when, how long, which sets."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """Loss and rollout settings that switch at given steps (``forge.training.phases``)."""
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    """Metric backends (``jsonl``, ``tensorboard``, ``wandb``)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: never)."""
    restart_on_failure: int = 0
    """Restarts from the last checkpoint if the trainer dies (needs ``checkpoint_every``)."""
    stream: bool = False
    """Trajectory streaming: train on a step's first groups while the rest are sampled."""
    batch_timeout_s: float = 600.0
    """No usable batch for this long: the run stops with a named error."""
    threads_per_actor: int = 0
    """Torch threads per actor process (0: the host's thread budget, ``controller.threads``)."""
    seed: int = 0
    """The run's seed; every role's seed derives from it (``seed_defaults``)."""
    deterministic: bool = False
    """Same config and seed, same numbers on the same machine (slower; ``DETERMINISTIC``)."""
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
        data = seed_defaults(data, SEEDED_ROLES)
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
