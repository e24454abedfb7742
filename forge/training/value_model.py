"""The value model (critic) of PPO and its optimisation core, no actors involved.

The value model is the policy's architecture with a scalar head: the causal LM's decoder
body (``AutoModelForCausalLM.get_decoder()``, the LM head is dropped) and an
``nn.Linear(hidden, 1)`` initialised to zero, so every value starts at 0. The head runs in
float32 whatever the body's dtype.

Alignment: ``values_bt[t]`` is the head applied to the hidden state at ``t - 1``, i.e. the
estimate of the return in the state "tokens ``< t`` read", before ``input_ids[t]`` is
emitted. That is the same state ``logprobs_bt[t]`` conditions on, so values, logprobs and
per-token advantages line up token for token (see ``forge.losses.value``). Position 0, padding
and positions after padding hold 0, exactly where ``forge.models.token_logprobs`` does.

``CriticCore(cfg).train_step(batch, returns_bt, old_values_bt)`` does one AdamW update on
``forge.losses.value.clipped_value_loss`` over the batch's counted tokens, in micro-batches of
``micro_batch_size`` rows whose losses are scaled by their share of the loss denominator, so
the accumulated gradient equals the one-big-batch gradient (as in
``forge.training.trainer_core``). One process: the critic is not data parallel.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from forge.losses.value import clipped_value_loss
from forge.models import position_ids_from_mask
from forge.models.loading import DTYPES
from forge.models.precision import resolve_device
from forge.training.lora import load_base_model
from forge.training.schedule import build_optimizer, build_scheduler
from forge.training.trainer_config import (
    DEVICES,
    OptimizerConfig,
    ScheduleConfig,
    _choice,
    _positive,
    check_master_weights,
)
from forge.training.trainer_core import loss_denominator
from forge.types import TrainBatch

__all__ = ["CRITIC_FILE", "CriticConfig", "CriticCore", "ValueModel"]

CRITIC_FILE = "critic_state.pt"
# dr_grpo divides by a constant width that micro-batches would each see differently.
CRITIC_AGGREGATIONS = ("token_mean", "seq_mean")


@dataclass
class CriticConfig:
    """Everything the critic (PPO's value model) needs."""

    model: str
    """HF causal-LM directory or hub id whose body the value model reuses (default: the
    policy's starting model)."""
    dtype: str = "float32"
    """The model's dtype."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: ``cuda`` when a GPU is visible, else ``cpu``."""
    attn_implementation: str = "eager"
    """The transformers attention implementation."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (``None``: the whole batch)."""
    value_clip_eps: float | None = 0.2
    """Clip range of the value loss around the old values (``None``: no clipping)."""
    aggregation: Literal["token_mean", "seq_mean"] = "token_mean"
    """How the value loss is reduced over tokens."""
    gamma: float = 1.0
    """GAE's discount."""
    lam: float = 1.0
    """GAE's lambda."""
    level: Literal["token", "turn"] = "token"
    """``token`` (GAE over tokens, one terminal reward) or ``turn`` (multi-turn: GAE over
    turns from the environment's per-turn rewards, a turn's value read at its first sampled
    token; ``forge.losses.value.turn_gae_advantages``)."""
    bootstrap_truncated: bool = False
    """``level: turn``: an episode cut by ``max_turns`` is bootstrapped from the critic's
    value of the state it was cut in, instead of counting as ended there."""
    seed: int = 0
    """Seeds torch in the critic process (in a run: the run's seed)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The value model's optimizer."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The value model's learning-rate schedule."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"CriticConfig.model must be a model directory or hub id, got {self.model!r}"
            )
        _choice("CriticConfig", "dtype", self.dtype, DTYPES)
        _choice("CriticConfig", "device", self.device, DEVICES)
        _choice("CriticConfig", "aggregation", self.aggregation, CRITIC_AGGREGATIONS)
        _choice("CriticConfig", "level", self.level, ("token", "turn"))
        if self.bootstrap_truncated and self.level != "turn":
            raise ValueError(
                "CriticConfig.bootstrap_truncated needs level=turn (it bootstraps episodes "
                "cut by env.max_turns)"
            )
        _positive("CriticConfig", "micro_batch_size", self.micro_batch_size)
        _positive("CriticConfig", "value_clip_eps", self.value_clip_eps, allow_zero=True)
        for key in ("gamma", "lam"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"CriticConfig.{key} must be in [0, 1], got {value!r}")
        for key, cls in (("optimizer", OptimizerConfig), ("schedule", ScheduleConfig)):
            value = getattr(self, key)
            if isinstance(value, dict):  # convenience for Python callers: nested dicts
                setattr(self, key, cls(**value))
            elif not isinstance(value, cls):
                raise TypeError(
                    f"CriticConfig.{key} must be a {cls.__name__} (or a dict of its fields), "
                    f"got {type(value).__name__}"
                )
        check_master_weights("critic", self.dtype, self.optimizer, autocast=False)


class ValueModel(nn.Module):
    """Decoder body plus a zero-initialised scalar head; ``forward`` gives ``values_bt``."""

    def __init__(self, body: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids_bt: torch.Tensor, attention_mask_bt: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` float32 values aligned like logprobs (module docstring)."""
        hidden_btd = self.body(
            input_ids=input_ids_bt,
            attention_mask=attention_mask_bt,
            position_ids=position_ids_from_mask(attention_mask_bt),
        ).last_hidden_state[:, :-1]
        v_bt = self.head(hidden_btd.float()).squeeze(-1)
        v_bt = torch.cat([v_bt.new_zeros(v_bt.shape[0], 1), v_bt], dim=1)
        valid_bt = attention_mask_bt.bool().clone()
        valid_bt[:, 1:] &= attention_mask_bt[:, :-1].bool()
        valid_bt[:, 0] = False
        return torch.where(valid_bt, v_bt, torch.zeros_like(v_bt))


def _check_bt(mask_bt: torch.Tensor, **tensors_bt: torch.Tensor | None) -> None:
    for name, t in tensors_bt.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != mask_bt.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but the batch is {tuple(mask_bt.shape)}; "
                "pass one value per token of batch.input_ids_bt"
            )


def _parts(batch, returns_bt, old_values_bt) -> list[tuple[TrainBatch, torch.Tensor, Any]]:
    """``(batch, returns, old values)`` triples from one batch or from lists of each."""
    if isinstance(batch, TrainBatch):
        return [(batch, returns_bt, old_values_bt)]
    batches = list(batch)
    olds = [None] * len(batches) if old_values_bt is None else list(old_values_bt)
    if not batches or not len(batches) == len(returns_bt) == len(olds):
        raise ValueError(
            f"critic train_step got {len(batches)} batches, {len(returns_bt)} returns and "
            f"{len(olds)} old values; pass one of each per batch"
        )
    return list(zip(batches, returns_bt, olds))


class CriticCore:
    """Value model, AdamW and schedule of the critic. See the module docstring."""

    def __init__(self, cfg: CriticConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        # (An exported LoRA policy, an adapter directory, loads as its merged model.)
        lm = load_base_model(cfg.model, cfg.dtype, self.device, cfg.attn_implementation)
        self.model = ValueModel(lm.get_decoder(), lm.config.hidden_size).to(self.device)
        del lm  # the LM head is not part of the value model
        self.model.train()
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule)
        self.step = 0

    def values(self, input_ids_bt: torch.Tensor, attention_mask_bt: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` values at the current weights (with grad if enabled), on ``device``."""
        return self.model(input_ids_bt.to(self.device), attention_mask_bt.to(self.device))

    @torch.no_grad()
    def batch_values(self, batch: TrainBatch) -> torch.Tensor:
        """No-grad ``[B, T]`` float32 CPU values of every attended token of ``batch`` (prompt
        too), ``micro_batch_size`` rows at a time."""
        rows = batch.input_ids_bt.shape[0]
        per = self.cfg.micro_batch_size or rows
        pieces = [
            self.values(batch.input_ids_bt[i : i + per], batch.attention_mask_bt[i : i + per])
            for i in range(0, rows, per)
        ]
        return torch.cat(pieces, dim=0).cpu()

    def compute_gradients(
        self,
        batch: TrainBatch | Sequence[TrainBatch],
        returns_bt: torch.Tensor | Sequence[torch.Tensor],
        old_values_bt: torch.Tensor | Sequence[torch.Tensor | None] | None = None,
    ) -> dict[str, float]:
        """Zero the gradients and accumulate those of the value loss over micro-batches.

        ``batch`` may be a list of batches (a step's per-rank batches), with ``returns_bt``
        and ``old_values_bt`` lists of the same length: the gradient is then the one of the
        value loss over all of them together (each part weighted by its share of the
        aggregation's denominator), as if they were one batch. ``old_values_bt=None`` uses
        this forward pass's values, detached (the values at the weights before the update,
        as ``old_logprobs="current"`` does for the policy): then clipping never binds on this
        single update. Returns the loss's metrics over the whole batch plus ``tokens``.
        """
        parts = _parts(batch, returns_bt, old_values_bt)
        agg = self.cfg.aggregation
        masks = [b.response_mask_bt.float().to(self.device) for b, _, _ in parts]
        denom = max(sum(loss_denominator(m, agg) for m in masks), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        seen = []  # (values, old values, returns, mask) of each part, for the metrics
        for (b, ret_bt, old_bt), mask_bt in zip(parts, masks):
            _check_bt(mask_bt, returns_bt=ret_bt, old_values_bt=old_bt)
            ret_bt = ret_bt.float().to(self.device)
            old_bt = None if old_bt is None else old_bt.float().to(self.device)
            rows = mask_bt.shape[0]
            per = self.cfg.micro_batch_size or rows
            values_pieces = []
            for start in range(0, rows, per):
                sl = slice(start, start + per)
                v_bt = self.values(b.input_ids_bt[sl], b.attention_mask_bt[sl])
                old_v_bt = v_bt.detach() if old_bt is None else old_bt[sl]
                loss, _ = clipped_value_loss(
                    v_bt, old_v_bt, ret_bt[sl], mask_bt[sl], self.cfg.value_clip_eps, agg
                )
                (loss * (loss_denominator(mask_bt[sl], agg) / denom)).backward()
                values_pieces.append(v_bt.detach())
            values_bt = torch.cat(values_pieces, dim=0)
            seen.append((values_bt, values_bt if old_bt is None else old_bt, ret_bt, mask_bt))
        # Metrics of the whole batch at once (explained variance does not average over parts).
        width = max(m.shape[1] for m in masks)
        values_bt, old_bt, ret_bt, mask_bt = (
            torch.cat([F.pad(part[i], (0, width - part[i].shape[1])) for part in seen])
            for i in range(4)
        )
        with torch.no_grad():
            _, metrics = clipped_value_loss(
                values_bt, old_bt, ret_bt, mask_bt, self.cfg.value_clip_eps, agg
            )
        metrics["tokens"] = float(mask_bt.sum().item())
        return metrics

    def train_step(
        self,
        batch: TrainBatch | Sequence[TrainBatch],
        returns_bt: torch.Tensor | Sequence[torch.Tensor],
        old_values_bt: torch.Tensor | Sequence[torch.Tensor | None] | None = None,
    ) -> dict[str, float]:
        """One update towards ``returns_bt`` on ``batch``'s counted tokens (a list of batches:
        one update on all of them, see ``compute_gradients``). Returns ``value_loss``,
        ``value_clip_fraction``, ``explained_variance``, ``value_mean``, ``return_mean`` (all
        before the update), ``grad_norm`` (before clipping), ``lr``, ``tokens``, ``step`` and
        ``seconds``."""
        t0 = time.perf_counter()
        metrics = self.compute_gradients(batch, returns_bt, old_values_bt)
        metrics["grad_norm"] = self._clip_and_step()
        metrics.update(lr=self.last_lr, step=float(self.step))
        metrics["seconds"] = time.perf_counter() - t0
        return metrics

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if self.cfg.optimizer.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.optimizer.max_grad_norm, norm)
        self._last_lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(norm.item())

    @property
    def last_lr(self) -> float:
        """The learning rate the last ``train_step`` used."""
        return getattr(self, "_last_lr", self.scheduler.get_last_lr()[0])

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Weights (body and head), optimizer, scheduler and step, all on CPU-loadable form."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (same model architecture)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])

    def save(self, path: str | Path) -> Path:
        """Write the state to ``path/critic_state.pt`` (creating ``path``); returns ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / CRITIC_FILE)
        return path

    def load(self, path: str | Path) -> int:
        """Restore from a directory written by ``save``; returns the restored step."""
        file = Path(path) / CRITIC_FILE
        if not file.exists():
            raise FileNotFoundError(
                f"{path} is not a critic checkpoint (no {CRITIC_FILE}); write one with "
                "Critic.save(dir)"
            )
        self.load_state_dict(torch.load(file, map_location=self.device, weights_only=True))
        return self.step
