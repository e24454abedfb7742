"""Typed configs of the trainer and the reference model.

Each is a plain dataclass that checks itself in ``__post_init__`` (so a bad value fails when
the config is built, before any process starts) and nests the configs of its parts::

    TrainerConfig(
        model="/tmp/tiny",
        optimizer=OptimizerConfig(lr=1e-5, max_grad_norm=1.0),
        schedule=ScheduleConfig(warmup_steps=10, decay="cosine", total_steps=1000),
        loss=LossConfig(type="grpo", kl_coef=0.01),
        micro_batch_size=8,
    )

``forge.config.config_from_dict(TrainerConfig, yaml_dict)`` builds one from YAML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

from forge.losses import LossConfig
from forge.losses.loss_config import zero_advantage_inexact
from forge.models.precision import resolve_auto, warn_if_slow_bf16
from forge.training.reference_update import ReferenceUpdateConfig
from forge.weights.transport_config import WeightTransportConfig

__all__ = [
    "BACKENDS",
    "DECAYS",
    "LoraConfig",
    "OLD_LOGPROBS",
    "OPTIMIZERS",
    "PARALLELISMS",
    "OptimizerConfig",
    "ReferenceConfig",
    "ScheduleConfig",
    "TrainerConfig",
]

# The choices of the string fields: a ``Literal`` each (the config loader checks a YAML value
# against it and lists the choices), and its tuple for ``__post_init__``'s check of Python
# callers.
Optimizer = Literal["adamw"]
Decay = Literal["constant", "linear", "cosine"]
Parallelism = Literal["ddp", "fsdp"]
Backend = Literal["hf", "titan"]
OldLogprobs = Literal["generator", "current"]
Device = Literal["auto", "cpu", "cuda"]
AutocastDtype = Literal["bfloat16", "float16"]
ReferenceMode = Literal["auto", "adapter_disabled", "separate"]
OPTIMIZERS = get_args(Optimizer)
DECAYS = get_args(Decay)
PARALLELISMS = get_args(Parallelism)
BACKENDS = get_args(Backend)
OLD_LOGPROBS = get_args(OldLogprobs)
DEVICES = get_args(Device)
AUTOCAST_DTYPES = get_args(AutocastDtype)
REFERENCE_MODES = get_args(ReferenceMode)


def _choice(owner: str, key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{key}: unknown value {value!r}; choose one of {choices}")


def check_tis(loss, old_logprobs: str, key: str = "trainer.loss") -> None:
    """A TIS cap with ``old_logprobs="generator"`` would weigh every token by exactly
    ``pi_generator / pi_generator = 1``: a knob with no effect, so an error naming the fix."""
    if loss.tis_cap is not None and old_logprobs == "generator":
        raise ValueError(
            f"{key}.tis_cap={loss.tis_cap} has no effect with trainer.old_logprobs=generator: "
            "TIS weighs each token by pi_old / pi_generator, and with the generator's logprobs "
            "as pi_old every weight is exactly 1. Set trainer.old_logprobs: current (the "
            "trainer's own logprobs before the update, which is what TIS corrects towards), "
            "or remove tis_cap"
        )


def check_gspo(loss, old_logprobs: str, key: str = "trainer.loss") -> None:
    """GSPO clips each sequence's ratio to a band of 3e-4 / 4e-4. With the generator's
    logprobs as ``pi_old`` the generator/trainer mismatch alone (bf16 kernels, batch shapes)
    puts most sequences outside it at the first update, and a sequence outside it on its
    advantage's side (above with ``A > 0``, below with ``A < 0``) gets no gradient: an error
    naming the fix."""
    if loss.type == "gspo" and old_logprobs == "generator":
        raise ValueError(
            f"{key}.type=gspo with trainer.old_logprobs=generator: GSPO clips each sequence's "
            "ratio pi / pi_old to [1 - 3e-4, 1 + 4e-4] (clip_eps_low / clip_eps_high), and "
            "with the generator's logprobs as pi_old the generator/trainer mismatch alone puts "
            "most sequences outside that band at the first update, where about half of them "
            "get no gradient. Set trainer.old_logprobs: current (the ratio is then 1 at the "
            "update) with loss.tis_cap to correct the mismatch, or use loss.type grpo"
        )


def check_master_weights(
    owner: str, dtype: str, optimizer: OptimizerConfig, autocast: bool = True
) -> None:
    """Parameters trained in bfloat16 or float16 under AdamW, which keeps no float32 master
    copy, lose every update smaller than half a unit in the last place: at lr 1e-6 a bf16
    weight near 0.02 (half-ulp 6e-5) does not move, while the loss looks healthy. An error
    unless ``optimizer.low_precision_weights`` opts in. ``autocast``: whether ``owner`` has
    an ``autocast`` key to name in the fix."""
    if dtype in ("bfloat16", "float16") and not optimizer.low_precision_weights:
        mixed = f" with {owner}.autocast: bfloat16 (float32 weights and Adam state, bf16 matmuls)"
        fix = f"{owner}.dtype: float32{mixed if autocast else ''}"
        raise ValueError(
            f"{owner}.dtype={dtype} trains {dtype} parameters with AdamW, which keeps no "
            "float32 master copy: a step smaller than half the weight's last place rounds "
            "away (lr 1e-6 against a bf16 half-ulp of 6e-5 at 0.02), so the run logs healthy "
            f"losses and barely trains. Set {fix}, or set "
            f"{owner}.optimizer.low_precision_weights: true to train in {dtype} anyway"
        )


def check_zero_skip(loss, skip: bool | None, key: str = "trainer") -> None:
    """``skip_zero_advantage=True`` where a zero-advantage row's gradient is not exactly 0
    would change the update: an error that says why."""
    if skip is not None and not isinstance(skip, bool):
        raise TypeError(f"{key}.skip_zero_advantage must be true, false or null, got {skip!r}")
    why = zero_advantage_inexact(loss) if skip else None
    if why is not None:
        raise ValueError(
            f"{key}.skip_zero_advantage=true, but {why}, so rows with advantage 0 still have "
            "a gradient and skipping them would change the update; set it to null (skip only "
            "where exact) or false"
        )


def _positive(owner: str, key: str, value: float | int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{owner}.{key} must be {bound}, got {value!r}")


@dataclass
class OptimizerConfig:
    """AdamW and gradient clipping."""

    type: Optimizer = "adamw"
    """The optimizer."""
    lr: float = 1e-5
    """The peak learning rate (the schedule multiplies it)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's moment decays."""
    eps: float = 1e-8
    """Adam's denominator term."""
    weight_decay: float = 0.0
    """Decoupled (AdamW) weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the global L2 norm of the gradients to this (``None``: no clipping; the norm is
    still measured and reported as ``grad_norm``)."""
    low_precision_weights: bool = False
    """Allow training parameters held in bfloat16 or float16 (the owner's ``dtype``, full
    fine-tuning): AdamW then updates them and its moments in that type with no float32 master
    copy, and a step smaller than half a weight's last place is lost (at lr 1e-6, in bf16,
    every weight of size 2^-11 = 4.9e-4 or more). Without it such a ``dtype`` is an error at
    load; train in ``dtype: float32`` instead (the trainer: with ``autocast: bfloat16``)."""

    def __post_init__(self) -> None:
        _choice("OptimizerConfig", "type", self.type, OPTIMIZERS)
        _positive("OptimizerConfig", "lr", self.lr)
        _positive("OptimizerConfig", "eps", self.eps)
        _positive("OptimizerConfig", "weight_decay", self.weight_decay, allow_zero=True)
        _positive("OptimizerConfig", "max_grad_norm", self.max_grad_norm)
        self.betas = tuple(self.betas)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(
                f"OptimizerConfig.betas must be two floats in [0, 1), got {self.betas}"
            )


@dataclass
class ScheduleConfig:
    """Learning-rate multiplier per optimizer step (0-based): linear warmup, then ``decay``
    (``forge.training.schedule``)."""

    warmup_steps: int = 0
    """Steps of linear warmup: step ``s < warmup_steps`` gets ``(s + 1) / warmup_steps``."""
    decay: Decay = "constant"
    """After warmup: ``constant`` (1.0 forever), or ``linear`` / ``cosine`` from 1.0 down to
    ``min_lr_ratio`` at ``total_steps``."""
    total_steps: int | None = None
    """Where the decay reaches ``min_lr_ratio`` (required unless ``decay: constant``)."""
    min_lr_ratio: float = 0.0
    """The multiplier the decay ends at (and keeps after ``total_steps``)."""

    def __post_init__(self) -> None:
        _choice("ScheduleConfig", "decay", self.decay, DECAYS)
        _positive("ScheduleConfig", "warmup_steps", self.warmup_steps, allow_zero=True)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(
                f"ScheduleConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"
            )
        if self.decay != "constant":
            if self.total_steps is None:
                raise ValueError(
                    f"ScheduleConfig.decay={self.decay!r} needs total_steps (the step where the "
                    "decay reaches min_lr_ratio); set it or use decay='constant'"
                )
            if self.total_steps <= self.warmup_steps:
                raise ValueError(
                    f"ScheduleConfig.total_steps ({self.total_steps}) must be greater than "
                    f"warmup_steps ({self.warmup_steps})"
                )


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """Low-rank adapters (PEFT's LoRA) instead of full fine-tuning; needs ``forge[lora]``.
    Only adapter parameters train; pushes, checkpoints and exports carry only them
    (``forge.training.lora``)."""

    rank: int = 8
    """The adapters' rank (the update is ``B @ A * alpha / rank``)."""
    alpha: float = 16.0
    """The adapters' scale numerator (``alpha / rank`` scales ``B @ A``)."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training."""
    target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """Leaf names of the linear layers that get adapters (the default suits Qwen2/Llama; a
    name the model lacks is an error at model build that lists the model's linear layers)."""
    disabled_reference: bool = False
    """Set by the run config when ``reference.mode`` is ``adapter_disabled``: the KL term's
    reference logprobs come from this trainer's model with the adapter disabled."""

    def __post_init__(self) -> None:
        _positive("LoraConfig", "rank", self.rank)
        _positive("LoraConfig", "alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.target_modules, str):
            self.target_modules = (self.target_modules,)
        self.target_modules = tuple(self.target_modules)
        if not self.target_modules or not all(isinstance(t, str) for t in self.target_modules):
            raise ValueError(
                "LoraConfig.target_modules must be a non-empty list of linear layer names "
                f"(e.g. q_proj, v_proj), got {self.target_modules!r}"
            )

    @property
    def scaling(self) -> float:
        """The factor of ``B @ A`` in the update (PEFT's ``lora_alpha / r``)."""
        return self.alpha / self.rank


@dataclass
class TrainerConfig:
    """Everything the trainer needs (in a run, ``model`` and ``temperature`` follow the
    ``policy`` and ``weights`` the run's ``weights``)."""

    model: str
    """HF model directory or hub id."""
    backend: Backend = "hf"
    """``hf`` (transformers model) or ``titan`` (torchtitan model, needs ``forge[titan]``)."""
    dtype: str = "float32"
    """The parameters' dtype (and the compute dtype without ``autocast``)."""
    autocast: AutocastDtype | Literal["auto"] | None = None
    """Mixed precision: matmuls run in this type while parameters, gradients and optimizer
    state stay in ``dtype`` (float32); the LM head and the logprobs stay float32 (see
    ``autocast_head``). ``None``: all in ``dtype``. ``auto``: ``bfloat16`` where the device
    multiplies bf16 natively (``forge.models.precision``), else ``None``, since a CPU
    without native bf16 emulates it far slower than float32 (figures:
    docs/benchmarks.md)."""
    autocast_head: bool = False
    """With ``autocast``: run the LM head in the lower precision too (bf16 logits, upcast for
    the log-softmax, as TRL and verl do under mixed precision). The head is the step's
    largest product at long completions, so this shortens the step, and the
    trainer/generator ``mismatch_kl`` grows by the bf16 rounding of the logits (figures:
    docs/performance.md). ``False``: the head runs in float32."""
    skip_zero_advantage: bool | None = None
    """Skip the forward and backward of rows whose advantage is exactly 0 (every row of a
    group whose samples all got the same reward). Under the policy losses (``grpo``, ``gspo``,
    ``ppo``, ``reinforce``) with nothing added to them (``kl_coef`` and ``entropy_coef`` 0)
    such a row's gradient is exactly 0, and the loss keeps the whole batch's denominator, so
    the update is the same; the loss's diagnostics (``mismatch_kl``, ``clip_fraction``, ...)
    are then averages over the rows that train, and ``rows_skipped`` counts the others. One
    trainer rank (``train_step``). ``None``: skip wherever that holds; ``True``: the same, and
    an error where it does not; ``False``: compute every row."""
    device: Device = "auto"
    """``auto``: ``cuda`` when a GPU is visible, else ``cpu``."""
    attn_implementation: str = "eager"
    """The transformers attention implementation (``eager``, ``sdpa``, ...)."""
    parallelism: Parallelism = "ddp"
    """How trainer processes share the work: ``ddp`` (replicated weights, all-reduced
    gradients) or ``fsdp`` (FSDP2 ``fully_shard``: sharded weights, gradients and optimizer
    state)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward; gradients accumulate over a step's micro-batches
    (``None``: the whole batch at once)."""
    max_micro_tokens: int | None = 4096
    """One rank: a micro-batch spans at most this many token positions (rows x its longest
    scored tail), so a batch of long completions is split into several forward/backward
    passes and the activations and logits alive at once stay bounded (docs/models.md, memory
    per role); ``None``: no bound."""
    length_buckets: bool = True
    """Micro-batches hold rows of similar length (sorted), so less compute goes to padding;
    with ``micro_batch_size`` unset, one rank splits the batch wherever the padded positions
    saved exceed ``bucket_cost_tokens`` per extra micro-batch."""
    bucket_cost_tokens: int = 96
    """What one more forward/backward costs, in token positions (see ``length_buckets``)."""
    temperature: float = 1.0
    """Logprobs are of ``logits / temperature``; must equal the sampling temperature."""
    old_logprobs: OldLogprobs = "generator"
    """The policy ratio's denominator (and TIS weights' numerator): the generator's logprobs,
    or the trainer's own (``current``) at the weights before this step's update;
    ``loss.tis_cap`` needs ``current``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute."""
    seed: int = 0
    """Seeds torch in the trainer processes (in a run: the run's seed)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer and gradient clipping."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy loss and its knobs."""
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    """How ``push_weights`` publishes versions (the type generators and references pull
    with)."""
    lora: LoraConfig | None = None
    """Train low-rank adapters only (hf backend); ``None``: full fine-tuning."""
    memory_fraction: float = 0.0
    """The share of its GPU's memory each rank may use
    (``torch.cuda.set_per_process_memory_fraction``; a run's ``placement.trainer_memory``
    sets it; 0: no cap). Needs a GPU."""

    def __post_init__(self) -> None:
        f = self.memory_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ValueError(f"TrainerConfig.memory_fraction must be in [0, 1), got {f!r}")
        if f and self.device == "cpu":
            raise ValueError(
                f"TrainerConfig.memory_fraction={f} caps GPU memory, but device is cpu; "
                "set device: cuda (or auto) or remove it"
            )
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"TrainerConfig.model must be a model directory or hub id, got {self.model!r}"
            )
        _choice("TrainerConfig", "backend", self.backend, BACKENDS)
        _choice("TrainerConfig", "parallelism", self.parallelism, PARALLELISMS)
        _choice("TrainerConfig", "old_logprobs", self.old_logprobs, OLD_LOGPROBS)
        _choice("TrainerConfig", "device", self.device, DEVICES)
        _positive("TrainerConfig", "micro_batch_size", self.micro_batch_size)
        _positive("TrainerConfig", "max_micro_tokens", self.max_micro_tokens)
        _positive("TrainerConfig", "bucket_cost_tokens", self.bucket_cost_tokens, allow_zero=True)
        _positive("TrainerConfig", "temperature", self.temperature, allow_zero=True)
        if self.autocast != "auto":  # ``auto`` is judged where the trainer runs
            warn_if_slow_bf16("trainer.autocast", self.autocast, self.device)
        if self.autocast is not None:
            if self.autocast != "auto":
                _choice("TrainerConfig", "autocast", self.autocast, AUTOCAST_DTYPES)
            if self.dtype != "float32":
                raise ValueError(
                    f"TrainerConfig.autocast={self.autocast!r} with dtype={self.dtype!r}: "
                    "autocast keeps float32 parameters and computes in the lower precision; "
                    "set dtype: float32, or drop autocast to train in the dtype itself"
                )
        elif self.autocast_head:
            raise ValueError(
                "TrainerConfig.autocast_head=True without autocast does nothing: the head "
                "already runs in the parameters' dtype; set autocast: bfloat16, or drop it"
            )
        for key, cls in (
            ("optimizer", OptimizerConfig),
            ("schedule", ScheduleConfig),
            ("loss", LossConfig),
            ("weights", WeightTransportConfig),
            ("lora", LoraConfig),
        ):
            value = getattr(self, key)
            if key == "lora" and value is None:
                continue
            if isinstance(value, dict):  # convenience for Python callers: nested dicts
                setattr(self, key, cls(**value))
            elif not isinstance(value, cls):
                raise TypeError(
                    f"TrainerConfig.{key} must be a {cls.__name__} (or a dict of its fields), "
                    f"got {type(value).__name__}"
                )
        check_tis(self.loss, self.old_logprobs)
        check_gspo(self.loss, self.old_logprobs)
        check_zero_skip(self.loss, self.skip_zero_advantage)
        if self.lora is not None:
            self._check_lora()
        else:  # (LoRA adapters are float32 whatever the frozen base's dtype)
            check_master_weights("trainer", self.dtype, self.optimizer)

    def with_precision(self) -> TrainerConfig:
        """This config with its ``auto`` precision knobs decided for the device of the
        process that calls it (the trainer's own: ``forge.models.precision``), each decision
        printed once per process: ``autocast: auto`` becomes ``bfloat16`` where that device
        multiplies bf16 natively, else ``None`` (and ``autocast_head`` off); ``weights.dtype:
        auto`` becomes ``bfloat16`` there (pullers cast on load), else ``""`` (pushed as the
        parameters are held). A config without ``auto`` is returned as it is."""
        autocast, head, weights = self.autocast, self.autocast_head, self.weights
        if autocast == "auto":
            native = resolve_auto("trainer.autocast", "auto", self.device) == "bfloat16"
            autocast, head = ("bfloat16", head) if native else (None, False)
        if weights.dtype == "auto":
            native = resolve_auto("trainer.weights.dtype", "auto", self.device) == "bfloat16"
            weights = dataclasses.replace(weights, dtype="bfloat16" if native else "")
        if (autocast, head, weights) == (self.autocast, self.autocast_head, self.weights):
            return self
        return dataclasses.replace(self, autocast=autocast, autocast_head=head, weights=weights)

    def _check_lora(self) -> None:
        if self.backend != "hf":
            raise ValueError(
                f"TrainerConfig.lora needs trainer.backend hf (PEFT wraps transformers "
                f"models); got backend {self.backend!r}: set backend: hf or remove lora"
            )
        if self.parallelism == "fsdp":
            raise ValueError(
                "TrainerConfig.lora with parallelism fsdp is not supported yet (FSDP2 would "
                "shard frozen and trainable parameters together); use parallelism: ddp"
            )


@dataclass
class ReferenceConfig:
    """The reference policy of a KL term: same model layout and ``temperature`` as the
    trainer."""

    model: str
    """HF model directory or hub id (default: the policy's starting model)."""
    mode: ReferenceMode = "auto"
    """With a LoRA policy, ``adapter_disabled`` (the default then) computes the reference
    logprobs in the trainer from its own model with the adapter disabled (no second copy, no
    service); ``separate`` runs this model as its own service (the only mode without LoRA);
    ``auto`` picks between them (``forge.run.policy.resolve_lora``)."""
    dtype: str = "float32"
    """The model's dtype; ``auto``: ``bfloat16`` where the reference's device multiplies bf16
    natively, else ``float32``, decided in the reference's own process when it loads
    (``forge.models.precision``)."""
    device: Device = "auto"
    """``auto``: ``cuda`` when a GPU is visible, else ``cpu``."""
    attn_implementation: str = "eager"
    """The transformers attention implementation."""
    temperature: float = 1.0
    """Logprobs are of ``logits / temperature`` (in a run: the policy's)."""
    micro_batch_size: int | None = None
    """Rows per forward (``None``: the whole batch at once)."""
    update: ReferenceUpdateConfig = field(default_factory=ReferenceUpdateConfig)
    """How the reference follows the policy's pushed versions (default: frozen)."""
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    """Where ``update_weights`` looks versions up by number (in a run: the run's
    ``weights``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"ReferenceConfig.model must be a model directory or hub id, got {self.model!r}"
            )
        _choice("ReferenceConfig", "device", self.device, DEVICES)
        _choice("ReferenceConfig", "mode", self.mode, REFERENCE_MODES)
        _positive("ReferenceConfig", "micro_batch_size", self.micro_batch_size)
        _positive("ReferenceConfig", "temperature", self.temperature, allow_zero=True)
        for key, cls in (("update", ReferenceUpdateConfig), ("weights", WeightTransportConfig)):
            value = getattr(self, key)
            if isinstance(value, dict):  # convenience for Python callers: nested dicts
                setattr(self, key, cls(**value))
            elif not isinstance(value, cls):
                raise TypeError(
                    f"ReferenceConfig.{key} must be a {cls.__name__} (or a dict of its fields), "
                    f"got {type(value).__name__}"
                )
