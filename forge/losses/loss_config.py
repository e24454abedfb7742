"""``LossConfig`` and ``build_loss``: the one place a loss is chosen by its ``type``.

    loss_fn = build_loss(LossConfig(type="grpo", clip_eps_high=0.28, kl_coef=0.01))
    loss, metrics = loss_fn(
        logprobs_bt=lp_bt, generator_logprobs_bt=gen_bt, advantages_b=adv_b, mask_bt=mask_bt,
        old_logprobs_bt=old_bt, ref_logprobs_bt=ref_bt,   # both optional
    )
    loss.backward()

The total is ``policy loss + kl_coef * aggregate(kl_penalty(logprobs, ref))``, both reduced
with the same ``aggregation``; the KL is computed on the counted (response) positions only.
What each KL estimator's gradient does, and the numerical guards every loss applies, are in
``forge.losses.kl``, ``forge.losses.policy_gradient`` and docs/rl_maths.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from forge.losses.kl import KL_ESTIMATORS, kl_penalty
from forge.losses.normalize import AGGREGATION_MODES, aggregate, masked_mean, masked_values
from forge.losses.policy_gradient import grpo_loss, gspo_loss, ppo_clip_loss, reinforce_loss

__all__ = ["LOSS_TYPES", "LossConfig", "LossFn", "build_loss"]


@dataclass(frozen=True)
class _TypeDefaults:
    clip_eps_low: float
    clip_eps_high: float
    aggregation: str


# Per-type defaults used where the config leaves a field as None: GSPO's sequence ratios need
# a clip range three orders of magnitude tighter than token ratios.
_DEFAULTS = {
    "grpo": _TypeDefaults(0.2, 0.2, "token_mean"),
    "ppo": _TypeDefaults(0.2, 0.2, "token_mean"),
    "reinforce": _TypeDefaults(0.0, 0.0, "token_mean"),
    "gspo": _TypeDefaults(3e-4, 4e-4, "seq_mean"),
}
LOSS_TYPES = tuple(_DEFAULTS)


def _unknown_type(t: str) -> ValueError:
    return ValueError(
        f"unknown loss type: {t!r}; choose one of {LOSS_TYPES} or give an import string "
        "'package.module:fn' of a loss function (see forge.slots.LOSS)"
    )


_CUSTOM = _TypeDefaults(0.0, 0.0, "token_mean")


def _custom_loss(cfg: LossConfig) -> Callable[..., Any] | None:
    """The user loss named by ``cfg.type`` (an import string), kwargs bound; None if built-in."""
    if cfg.type in _DEFAULTS:
        return None
    if ":" not in cfg.type:
        raise _unknown_type(cfg.type)
    from forge.slots import LOSS

    return LOSS.resolve({"fn": cfg.type, "kwargs": cfg.kwargs}, key="loss.type")


@dataclass
class LossConfig:
    """Which policy loss to use and its knobs (``build_loss``)."""

    type: str = "grpo"
    """``grpo``, ``ppo``, ``reinforce`` or ``gspo``, or an import string ``pkg.module:fn`` of
    a loss function called with the keyword tensors of ``build_loss`` (plus ``kwargs``) and
    returning ``(loss, metrics)``."""
    clip_eps_low: float | None = None
    """The ratio's lower clip range (ignored by ``reinforce``; ``None``: the type's usual
    value, 0.2 for grpo and ppo, 3e-4 for gspo)."""
    clip_eps_high: float | None = None
    """The ratio's upper clip range (``None``: the type's usual value, 0.2 for grpo and ppo,
    4e-4 for gspo)."""
    clip_ratio_c: float | None = None
    """The dual clip of ``grpo``/``ppo``/``gspo`` (> 1, e.g. verl's 3.0; ``None``: off): a
    token (GSPO: sequence) with negative advantage and ratio above ``c`` has its loss capped
    at ``-c * A`` and no gradient (``forge.losses.policy_gradient``)."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference (0 disables it; reference logprobs passed are then
    only logged)."""
    kl_estimator: str = "k3"
    """``k1``, ``k2`` or ``k3``, or an import string ``pkg.module:fn``: ``k3``'s gradient is
    the forward KL(ref || pi)'s, ``k2``'s the reverse KL(pi || ref)'s, ``k1``'s is zero in
    expectation (``forge.losses.kl``)."""
    kl_clamp: float | None = None
    """Bound each token's KL estimate to ``[-kl_clamp, kl_clamp]``, with no gradient where it
    binds (verl clamps ``k3`` at 10: a token's ``k3`` gradient is then at most 12.6 instead of
    ``e^20``); ``None``: no bound."""
    tis_cap: float | None = None
    """Truncated importance sampling with this cap (2.0 is common): tokens are weighted by
    ``min(pi_old / pi_generator, cap)``; needs ``trainer.old_logprobs: current``."""
    aggregation: Literal["token_mean", "seq_mean", "dr_grpo"] | None = None
    """How token losses are reduced (``None``: ``token_mean``, ``seq_mean`` for gspo);
    ``dr_grpo`` divides the sum by the constant ``max_tokens``."""
    max_tokens: int | None = None
    """The constant divisor of ``dr_grpo`` aggregation, normally the generation
    ``max_tokens``; required for that mode."""
    entropy_coef: float = 0.0
    """An entropy bonus (0: off): the policy's entropy at each sampled token's state,
    estimated from the sampled tokens, so moves that became unlikely keep being tried;
    logged as ``entropy_sampled``."""
    entropy_cap: float | None = 3.0
    """Nats; bounds each sampled token's weight ``-logp`` in the entropy estimate, so the
    bonus keeps actions alive instead of filling the vocabulary's long tail (``None``: no
    cap)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments bound to a loss named by import string."""

    def __post_init__(self) -> None:
        _custom_loss(self)  # raises for an unknown name or an unusable import string
        for name in ("clip_eps_low", "clip_eps_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"LossConfig.{name} must be >= 0, got {value}")
        if self.clip_ratio_c is not None:
            if not self.clip_ratio_c > 1.0:
                raise ValueError(
                    f"LossConfig.clip_ratio_c must be > 1 (verl uses 3.0) or None, got "
                    f"{self.clip_ratio_c}"
                )
            if self.type not in ("grpo", "ppo", "gspo"):
                raise ValueError(
                    f"LossConfig.clip_ratio_c is the dual clip of a ratio, but loss type "
                    f"{self.type!r} has no clipped ratio it would apply to; remove it or use "
                    "grpo, ppo or gspo"
                )
        if self.kl_coef < 0:
            raise ValueError(f"LossConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if not self.entropy_coef >= 0:
            raise ValueError(f"LossConfig.entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.entropy_cap is not None and not self.entropy_cap > 0:
            raise ValueError(
                f"LossConfig.entropy_cap must be > 0 (nats) or None, got {self.entropy_cap}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            from forge.slots import KL

            KL.validate(self.kl_estimator, key="LossConfig.kl_estimator")
        if self.kl_clamp is not None and not self.kl_clamp > 0:
            raise ValueError(f"LossConfig.kl_clamp must be > 0 or None, got {self.kl_clamp}")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"LossConfig.tis_cap must be > 0 or None, got {self.tis_cap}")
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"LossConfig.aggregation: unknown aggregation mode {self.aggregation!r}; "
                f"choose one of {AGGREGATION_MODES}"
            )
        if self.resolved_aggregation() == "dr_grpo" and self.max_tokens is None:
            raise ValueError(
                "LossConfig.aggregation='dr_grpo' needs LossConfig.max_tokens (the generation "
                "max_tokens), the constant the summed loss is divided by"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"LossConfig.max_tokens must be >= 1, got {self.max_tokens}")

    def resolved_aggregation(self) -> str:
        """``aggregation``, or the type's default when it is ``None``."""
        return self.aggregation or _DEFAULTS.get(self.type, _CUSTOM).aggregation

    def resolved_clip(self) -> tuple[float, float]:
        """``(clip_eps_low, clip_eps_high)`` with ``None`` replaced by the type's defaults."""
        d = _DEFAULTS.get(self.type, _CUSTOM)
        low = d.clip_eps_low if self.clip_eps_low is None else self.clip_eps_low
        high = d.clip_eps_high if self.clip_eps_high is None else self.clip_eps_high
        return low, high


LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def _entropy_surrogate(lp: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """A term whose value is 0 and whose gradient is ``logp * grad logp`` aggregated over the
    sampled tokens: in expectation over the sampling, ``-grad H`` (E[grad logp] = 0), so
    minimizing it raises the entropy of each state's next-token distribution. With
    ``entropy_cap`` the weight ``logp`` is clamped at ``-entropy_cap``."""
    lp = masked_values(lp, mask)  # a masked NaN would give NaN * 0 in the backward
    weight = lp.detach()
    if cfg.entropy_cap is not None:
        weight = weight.clamp(min=-cfg.entropy_cap)
    return aggregate(weight * (lp - lp.detach()), mask, cfg.resolved_aggregation(), cfg.max_tokens)


def _policy_loss(
    cfg: LossConfig,
    lp: torch.Tensor,
    gen: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    old: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dispatch to the policy loss of ``cfg.type`` with the resolved knobs."""
    low, high = cfg.resolved_clip()
    knobs = {
        "tis_cap": cfg.tis_cap,
        "aggregation": cfg.resolved_aggregation(),
        "max_tokens": cfg.max_tokens,
    }
    if cfg.type == "reinforce":
        return reinforce_loss(
            lp, adv, mask, old_logprobs_bt=old, generator_logprobs_bt=gen, **knobs
        )
    knobs.update(clip_eps_low=low, clip_eps_high=high, clip_ratio_c=cfg.clip_ratio_c)
    if cfg.type == "grpo":
        return grpo_loss(lp, gen, adv, mask, old_logprobs_bt=old, **knobs)
    if cfg.type == "gspo":
        return gspo_loss(lp, gen, adv, mask, old_logprobs_bt=old, **knobs)
    if cfg.type == "ppo":
        old_bt = gen if old is None else old
        return ppo_clip_loss(lp, old_bt, adv, mask, generator_logprobs_bt=gen, **knobs)
    raise _unknown_type(cfg.type)


def zero_advantage_inexact(config: LossConfig) -> str | None:
    """Why a row with advantage 0 may have a nonzero gradient under ``config`` (``None``:
    its gradient is exactly 0, so a trainer may skip the row; see
    ``TrainerConfig.skip_zero_advantage``)."""
    if config.type not in ("grpo", "gspo", "ppo", "reinforce"):
        return f"loss.type {config.type!r} is not one of the built-in policy losses"
    if config.kl_coef > 0:
        return f"loss.kl_coef={config.kl_coef} adds a KL term that every row has"
    if config.entropy_coef > 0:
        return f"loss.entropy_coef={config.entropy_coef} adds an entropy term that every row has"
    return None


def build_loss(config: LossConfig) -> LossFn:
    """Return ``loss_fn(**tensors) -> (loss, metrics)`` for ``config`` (see module docstring).

    Keyword tensors: ``logprobs_bt`` (with grad), ``generator_logprobs_bt``, ``advantages_b``
    (``[B]``; ``ppo`` also takes ``[B, T]``), ``mask_bt``, and optionally ``old_logprobs_bt``
    and ``ref_logprobs_bt``. Metrics add ``kl_ref`` when a reference is given, and ``loss``.
    """
    custom = _custom_loss(config)

    def loss_fn(
        *,
        logprobs_bt: torch.Tensor,
        generator_logprobs_bt: torch.Tensor,
        advantages_b: torch.Tensor,
        mask_bt: torch.Tensor,
        old_logprobs_bt: torch.Tensor | None = None,
        ref_logprobs_bt: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if custom is not None:
            loss, metrics = custom(
                logprobs_bt=logprobs_bt,
                generator_logprobs_bt=generator_logprobs_bt,
                advantages_b=advantages_b,
                mask_bt=mask_bt,
                old_logprobs_bt=old_logprobs_bt,
            )
            metrics = dict(metrics)
        else:
            loss, metrics = _policy_loss(
                config, logprobs_bt, generator_logprobs_bt, advantages_b, mask_bt, old_logprobs_bt
            )
        if ref_logprobs_bt is not None:
            # Response positions only: the reference holds 0 on prompt positions while the
            # policy's logprobs are real there, and exp(q - p) of such a gap overflows.
            kl_bt = kl_penalty(
                logprobs_bt, ref_logprobs_bt, config.kl_estimator, mask_bt, config.kl_clamp
            )
            kl = aggregate(kl_bt, mask_bt, config.resolved_aggregation(), config.max_tokens)
            metrics["kl_ref"] = kl.item()
            if config.kl_coef > 0:
                loss = loss + config.kl_coef * kl
        elif config.kl_coef > 0:
            raise ValueError(
                f"kl_coef={config.kl_coef} needs ref_logprobs_bt; pass the reference model's "
                "logprobs or set kl_coef=0"
            )
        if config.entropy_coef > 0:
            loss = loss + config.entropy_coef * _entropy_surrogate(logprobs_bt, mask_bt, config)
        metrics["entropy_sampled"] = masked_mean(-logprobs_bt.detach(), mask_bt).item()
        metrics["loss"] = loss.item()
        return loss, metrics

    return loss_fn
