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

from dataclasses import dataclass, field

from forge.losses import LossConfig
from forge.training.reference_update import ReferenceUpdateConfig
from forge.weights.config import WeightTransportConfig

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

OPTIMIZERS = ("adamw",)
DECAYS = ("constant", "linear", "cosine")
PARALLELISMS = ("ddp", "fsdp")
BACKENDS = ("hf", "titan")
OLD_LOGPROBS = ("generator", "current")
DEVICES = ("auto", "cpu", "cuda")
AUTOCAST_DTYPES = ("bfloat16", "float16")
REFERENCE_MODES = ("auto", "adapter_disabled", "separate")


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


def _positive(owner: str, key: str, value: float | int | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{owner}.{key} must be {bound}, got {value!r}")


@dataclass
class OptimizerConfig:
    """AdamW and gradient clipping.

    ``max_grad_norm``: clip the global L2 norm of the gradients to this (``None`` disables
    clipping; the norm is still measured and reported as ``grad_norm``).
    """

    type: str = "adamw"
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0

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
    """Learning-rate multiplier per optimizer step ``s`` (0-based), see ``forge.training.schedule``.

    Linear warmup over ``warmup_steps`` (step ``s < warmup_steps`` gets ``(s + 1) /
    warmup_steps``), then ``decay``: ``constant`` (1.0 forever), or ``linear`` / ``cosine``
    from 1.0 down to ``min_lr_ratio`` at ``total_steps`` (and ``min_lr_ratio`` after it).
    """

    warmup_steps: int = 0
    decay: str = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.0

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

    ``rank`` and ``alpha`` (the update is ``B @ A * alpha / rank``), ``dropout`` on the
    adapter's input while training, ``target_modules``: the leaf names of the linear layers
    that get adapters (the default suits Qwen2/Llama; a name the model lacks is an error at
    model build that lists the model's linear layers). Only adapter parameters train; pushes,
    checkpoints and exports carry only them (``forge.training.lora``).
    ``disabled_reference``: the KL term's reference logprobs come from this trainer's own
    model with the adapter disabled (the base), computed in ``train_step``; set by the run
    config when ``reference.mode`` is ``adapter_disabled``.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    disabled_reference: bool = False

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
    """Everything the trainer needs.

    ``model``: HF model directory or hub id. ``backend``: ``hf`` (transformers model) or
    ``titan`` (torchtitan model, needs ``forge[titan]``). ``parallelism``: how ranks share
    the work when the trainer runs on more than one process: ``ddp`` (replicated weights,
    all-reduced gradients) or ``fsdp`` (FSDP2 ``fully_shard``: sharded weights, gradients and
    optimizer state). ``micro_batch_size``: rows per forward/backward; gradients accumulate
    over the micro-batches of a step (``None``: the whole batch at once). ``temperature``:
    must equal the generator's, since logprobs are of ``logits / temperature``.
    ``old_logprobs``: the denominator of the policy ratio and numerator of TIS weights;
    ``generator`` uses the generator's logprobs, ``current`` the trainer's own logprobs at
    the weights before this step's update (see ``forge.training.trainer_core``). ``loss.tis_cap``
    needs ``current``: with ``generator`` every TIS weight is 1, so that pair is an error.
    ``length_buckets``: micro-batches hold rows of similar length (sorted), so less compute
    goes to padding; with ``micro_batch_size`` unset, one trainer rank splits the batch
    wherever the padded positions saved exceed ``bucket_cost_tokens`` (what one more
    forward/backward costs, in token positions) per extra micro-batch. ``weights``: how
    ``push_weights`` publishes versions (``forge.weights.WeightTransportConfig``, the same
    type generators and reference models pull with). ``lora``: train low-rank adapters
    only (``LoraConfig``; hf backend); ``None``: full fine-tuning. ``autocast``: mixed
    precision, ``bfloat16`` (or ``float16``): matmuls run in that type while parameters,
    gradients and optimizer state stay in ``dtype`` (float32); the LM head and the logprobs
    stay float32. On CPUs with AMX or AVX512-BF16 it is ~4-5x faster (docs/performance.md);
    ``None``: everything in ``dtype``.
    """

    model: str
    backend: str = "hf"
    dtype: str = "float32"
    autocast: str | None = None
    device: str = "auto"
    attn_implementation: str = "eager"
    parallelism: str = "ddp"
    micro_batch_size: int | None = None
    length_buckets: bool = True
    bucket_cost_tokens: int = 96
    temperature: float = 1.0
    old_logprobs: str = "generator"
    gradient_checkpointing: bool = False
    seed: int = 0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"TrainerConfig.model must be a model directory or hub id, got {self.model!r}"
            )
        _choice("TrainerConfig", "backend", self.backend, BACKENDS)
        _choice("TrainerConfig", "parallelism", self.parallelism, PARALLELISMS)
        _choice("TrainerConfig", "old_logprobs", self.old_logprobs, OLD_LOGPROBS)
        _choice("TrainerConfig", "device", self.device, DEVICES)
        _positive("TrainerConfig", "micro_batch_size", self.micro_batch_size)
        _positive("TrainerConfig", "bucket_cost_tokens", self.bucket_cost_tokens, allow_zero=True)
        _positive("TrainerConfig", "temperature", self.temperature, allow_zero=True)
        if self.autocast is not None:
            _choice("TrainerConfig", "autocast", self.autocast, AUTOCAST_DTYPES)
            if self.dtype != "float32":
                raise ValueError(
                    f"TrainerConfig.autocast={self.autocast!r} with dtype={self.dtype!r}: "
                    "autocast keeps float32 parameters and computes in the lower precision; "
                    "set dtype: float32, or drop autocast to train in the dtype itself"
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
        if self.lora is not None:
            self._check_lora()

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
    """The reference policy: same model layout and ``temperature`` as the trainer.

    ``micro_batch_size`` bounds the rows per forward (``None``: the whole batch at once).
    ``update``: how the reference follows the policy's pushed versions (``none``: frozen, the
    default; ``ema``; ``reset``; see ``forge.training.reference_update``). ``weights``: where
    ``update_weights`` looks versions up when given a number and no handle: a
    ``WeightTransportConfig``, the trainer's transport (as for the generator; by default the
    run's shm publication location). ``mode``: with a LoRA policy, ``adapter_disabled`` (the
    default then) computes the reference logprobs in the trainer, from its own model with the
    adapter disabled (no second copy of the weights, no reference service); ``separate``
    runs this reference model as its own service (the only mode without LoRA). ``auto``
    picks between them (``forge.run.config``).
    """

    model: str
    mode: str = "auto"
    dtype: str = "float32"
    device: str = "auto"
    attn_implementation: str = "eager"
    temperature: float = 1.0
    micro_batch_size: int | None = None
    update: ReferenceUpdateConfig = field(default_factory=ReferenceUpdateConfig)
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)

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


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
