"""Learning-rate schedule: linear warmup, then constant, linear or cosine decay.

``lr_multiplier(step, cfg)`` is the factor applied to the base learning rate for optimizer
step ``step`` (0-based: the first update uses ``step=0``). Warmup starts at ``1 / warmup``
rather than 0, so the first update is not wasted::

    warmup=4, decay=constant:   0.25, 0.5, 0.75, 1.0, 1.0, ...
    warmup=2, decay=linear, total=6, min=0:   0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0, ...

``build_scheduler`` wraps it in a ``torch.optim.lr_scheduler.LambdaLR`` (whose state dict
is just its step counter, so checkpoints stay small and exact).
"""

from __future__ import annotations

import math

import torch

from forge.training.trainer_config import ScheduleConfig

__all__ = ["build_scheduler", "lr_multiplier"]


def lr_multiplier(step: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (see module docstring)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    assert cfg.total_steps is not None  # ScheduleConfig guarantees it for decaying schedules
    progress = min(1.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    shape = 1.0 - progress if cfg.decay == "linear" else cosine
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over ``lr_multiplier``; call ``.step()`` once after each update."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg))


def build_optimizer(params, cfg) -> torch.optim.Optimizer:
    """AdamW from an ``OptimizerConfig`` (the only type so far)."""
    if cfg.type != "adamw":
        raise ValueError(f"unknown optimizer type: {cfg.type!r}; choose one of ('adamw',)")
    params = list(params)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=_can_fuse(params),
    )


def _can_fuse(params: list) -> bool:
    """Whether ``fused=True`` applies: plain float CPU or CUDA tensors. The fused kernel is
    the same update as the default ``foreach`` one (up to float rounding) and on a 2-core CPU
    several times faster (docs/performance.md); sharded (DTensor) parameters keep ``foreach``."""
    tensors = [p["params"] if isinstance(p, dict) else [p] for p in params]
    flat = [t for group in tensors for t in group]
    return bool(flat) and all(
        type(t.data) is torch.Tensor  # not a DTensor (FSDP shards)
        and t.device.type in ("cpu", "cuda")
        and t.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        for t in flat
    )
