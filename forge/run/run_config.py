"""The config every training app shares, and the one of apps that sample from their policy.

``RunConfig`` is what SFT, REINFORCE and GRPO all read (the policy, its trainer, a data
source, steps, metrics, threads, seed, determinism); each app's ``Config`` extends it with
exactly the fields it reads, so a knob the app would ignore is an unknown key at load:

    RunConfig                      apps/sft: + batch_size, output, history
    └─ RolloutRunConfig            + generator, rewards, replicas, weights, rollout, eval
       ├─ apps/reinforce           + baseline_decay
       └─ RLConfig (apps/grpo)     + reference, critic, env, phases, checkpoints, ...

The policy's facts (``policy:``, see ``forge.run.policy``) and the run's ``seed``
(``seed_defaults``) flow into the role sections the schema has when the config loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from forge.evaluation.sets import EvalSet
from forge.generation.backend import GeneratorConfig
from forge.plugins import Spec
from forge.rollout.scoring import RolloutConfig
from forge.run.policy import (
    SAME_TEMPERATURE,
    PolicyConfig,
    check_policy,
    policy_defaults,
    resolve_lora,
)
from forge.slots import DATA_SOURCE, REWARD
from forge.training.trainer_config import TrainerConfig
from forge.weights.transport_config import WeightTransportConfig

__all__ = [
    "EvalConfig",
    "ReplicasConfig",
    "RolloutRunConfig",
    "RunConfig",
    "check_sampling",
    "make_deterministic",
    "seed_defaults",
]


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
                f"run's seed (forge.run.run_config.seed_defaults); remove {role}.seed and set seed"
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
    teacher: int = 1
    """On-policy distillation teacher replicas (with a ``teacher`` section)."""

    def __post_init__(self) -> None:
        for name in ("generator", "rewards", "reward_model", "teacher"):
            if getattr(self, name) < 1:
                raise ValueError(f"replicas.{name} must be >= 1, got {getattr(self, name)}")
        if self.env < 0:
            raise ValueError(f"replicas.env must be >= 0 (0: in-process), got {self.env}")


@dataclass(kw_only=True)
class RunConfig:
    """What every training app reads (SFT, REINFORCE, GRPO); see the module docstring."""

    app: str
    """The app module that runs this config (e.g. ``apps.grpo.main``)."""
    policy: PolicyConfig
    """The policy's model and sampling temperature, stated once for every role."""
    trainer: TrainerConfig
    """The trainer (its model and temperature follow ``policy``)."""
    data: Spec
    """The data source (``forge.slots.DATA_SOURCE``: a built-in name or an import string,
    with ``kwargs``)."""
    steps: int = 100
    """Training steps."""
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    """Metric backends (``jsonl``, ``tensorboard``, ``wandb``)."""
    threads_per_actor: int = 0
    """Torch threads per actor process (0: the host's thread budget, ``controller.threads``)."""
    seed: int = 0
    """The run's seed; every role's seed is this one (``seed_defaults``)."""
    deterministic: bool = False
    """Same config and seed, same numbers on the same machine (slower; ``DETERMINISTIC``)."""
    # The role sections of the schema that follow the policy's model (``policy_defaults``).
    policy_roles: ClassVar[tuple[str, ...]] = ("trainer",)

    @classmethod
    def __config_prepare__(cls, data: dict[str, Any]) -> dict[str, Any]:
        for old, new in RENAMED.items():
            section, _, key = old.rpartition(".")
            holder = data.get(section) if section else data
            if isinstance(holder, dict) and key in holder:
                raise ValueError(f"{old} is now {new} (each fact is stated once); rename it")
        data = policy_defaults(data, cls.policy_roles)
        data = seed_defaults(data, tuple(r for r in cls.policy_roles if r in SEEDED_ROLES))
        if "weights" in cls.__dataclass_fields__ and isinstance(data.get("weights"), dict):
            data = {  # one transport: the pusher's and the pullers'
                k: {"weights": data["weights"], **v}
                if k in ("generator", "trainer", "reference") and isinstance(v, dict)
                else v
                for k, v in data.items()
            }
        return data

    @classmethod
    def __config_derived__(cls) -> dict[str, str]:
        """The keys ``__config_prepare__`` copies from another key, ``{key: the key it
        follows}`` (``forge config show`` marks them; ``forge.config.describe``)."""
        fields = cls.__dataclass_fields__
        derived: dict[str, str] = {}
        for role in (r for r in cls.policy_roles if r in fields):
            derived[f"{role}.model"] = "policy.model"
            if role in SAME_TEMPERATURE:
                derived[f"{role}.temperature"] = "policy.temperature"
            if role in SEEDED_ROLES:
                derived[f"{role}.seed"] = "seed"
            if "weights" in fields and role in ("generator", "trainer", "reference"):
                derived[f"{role}.weights"] = "weights"
        return derived

    def __post_init__(self) -> None:
        if self.deterministic:
            make_deterministic(self)
        # Resolve every user-supplied part now: a typo fails before anything spawns.
        DATA_SOURCE.validate(self.data, key="data")


@dataclass(kw_only=True)
class RolloutRunConfig(RunConfig):
    """A run that samples rollouts from its policy and scores them (REINFORCE, GRPO)."""

    generator: GeneratorConfig
    """The generator service (its model and temperature follow ``policy``)."""
    rewards: list[Spec] = field(default_factory=list)
    """Reward functions (``forge.slots.REWARD``); with an ``env``, they score each episode's
    final answer; with a ``teacher`` there may be none (pure distillation)."""
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    """How many replicas each service runs."""
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    """The weight transport, stated once for the trainer (pusher) and every puller."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How groups are generated, scored and filtered."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation: when, how long, which sets."""
    policy_roles: ClassVar[tuple[str, ...]] = ("generator", "trainer")

    def __post_init__(self) -> None:
        super().__post_init__()
        for i, spec in enumerate(self.rewards):
            REWARD.validate(spec, key=f"rewards[{i}]")
        if self.eval.reward is not None:
            REWARD.validate(self.eval.reward, key="eval.reward")
        reference = self._reference()
        check_policy(
            self.policy, generator=self.generator, trainer=self.trainer, reference=reference
        )
        # Resolved configs are new objects (the ones given stay as they are).
        self.trainer, self.generator, reference = resolve_lora(
            self.trainer, self.generator, reference
        )
        if reference is not None:
            self.reference = reference  # RLConfig's field
        for name, role in (("generator", self.generator), ("reference", reference)):
            if role is not None and _where(role.weights) != _where(self.trainer.weights):
                raise ValueError(
                    f"{name}.weights pulls from {_where(role.weights)} but trainer.weights "
                    f"pushes to {_where(self.trainer.weights)}; state the transport once in "
                    "the run's weights: section"
                )
        check_sampling(self.generator)
        if self._env() is None:
            if not self.rewards and self._teacher() is None:  # a teacher alone: distillation
                raise ValueError(
                    f"rewards: give at least one reward function (or an env, or a teacher); "
                    f"built-ins: {', '.join(REWARD.names())}"
                )
            if self.replicas.env:
                raise ValueError(f"replicas.env={self.replicas.env} but there is no env section")

    def _reference(self) -> Any:
        """The KL term's reference config (``RLConfig`` has one)."""
        return None

    def _env(self) -> Any:
        """The multi-turn environment's config (``RLConfig`` has one)."""
        return None

    def _teacher(self) -> Any:
        """The on-policy distillation teacher's config (``RLConfig`` has one)."""
        return None

    def reward_fns(self) -> list[Callable]:
        """The resolved reward functions."""
        return [REWARD.resolve(s) for s in self.rewards]

    def eval_reward_fn(self) -> Callable | None:
        """The reward that scores held-out answers (``None`` with an environment, and with
        neither ``rewards`` nor ``eval.reward``: pure distillation)."""
        if self._env() is not None:
            return None
        spec = self.eval.reward or (self.rewards[0] if self.rewards else None)
        return None if spec is None else REWARD.resolve(spec)  # None: pure distillation


DETERMINISTIC = {  # what a deterministic run changes, and why
    "threads_per_actor": (lambda v: v or 1, "fixed thread counts: float sums in one order"),
    "max_policy_age": (lambda v: 0, "on-policy: no race between rollouts and weight pushes"),
    "rollout.tasks": (lambda v: 1, "one rollout loop: requests reach the generator in order"),
    "stream": (lambda v: False, "whole batches: parts do not depend on arrival times"),
}


def make_deterministic(cfg: Any) -> list[str]:
    """Set what ``deterministic: true`` needs (``DETERMINISTIC``) on a run config and say
    what changed on stdout; returns the changes. Actors then run with torch's deterministic
    kernels and a fixed hash seed (``forge.run.actor_env_vars``). The same config and seed on the
    same machine then give the same metrics (times aside); it is slower."""
    changes = []
    for key, (rule, why) in DETERMINISTIC.items():
        holder, _, name = key.rpartition(".")
        obj = getattr(cfg, holder, None) if holder else cfg
        if not hasattr(obj, name):
            continue
        old = getattr(obj, name)
        new = rule(old)
        if new != old:  # a nested section is replaced, not changed: callers may hold it
            if holder:
                assert obj is not None  # (hasattr above)
                setattr(cfg, holder, dataclasses.replace(obj, **{name: new}))
            else:
                setattr(cfg, name, new)
            changes.append(f"{key}: {old} -> {new} ({why})")
    if changes:
        print(f"[forge] deterministic: {'; '.join(changes)}", flush=True)
    return changes


def _where(w: WeightTransportConfig) -> tuple[str, str, str]:
    """Where a transport's versions live (what pusher and pullers must agree on)."""
    return (w.type, w.prefix, w.root)
