"""Policy-gradient losses. Each returns ``(loss, metrics)``: a scalar to back-propagate and a
dict of plain floats for logging.

Shared conventions: ``logprobs_bt`` are the current policy's log-probabilities of the sampled
tokens (with grad), ``mask_bt`` is 1.0 on response tokens that count, every other logprob
input is treated as a constant (detached). ``aggregation`` / ``max_tokens`` choose the
reduction (see ``forge.losses.normalize``). Metrics are averages over counted tokens.

The clipped surrogate per token, with ratio ``r = exp(logprobs - old_logprobs)``, is

    loss_t = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

``eps_high > eps_low`` is DAPO's "clip-higher", which leaves low-probability tokens room to
grow and so slows entropy collapse.

Dual clip (``clip_ratio_c``, Ye et al. 2020, verl's ``clip_ratio_c``): for a negative
advantage the surrogate above grows without bound with ``r`` (a token whose ratio is 4.5
gets 4.5x the loss and gradient). With ``clip_ratio_c = c`` (> 1; verl uses 3.0) the loss of
such a token is capped at ``-c * A``, with zero gradient past it:
``loss_t = min(loss_t, -c * A)`` where ``A < 0``. ``None`` (the default) leaves it off.

Numerical guards, on every loss: inputs at masked positions are replaced by 0 with
``torch.where`` before any arithmetic (so their values, even ``inf``/``NaN``, change nothing),
and the log-ratio is clamped to ``[-20, 20]`` before ``exp`` (verl's bound), so a ratio is
always finite.
"""

from __future__ import annotations

import torch

from forge.losses.kl import LOG_RATIO_CLAMP
from forge.losses.normalize import aggregate, masked_mean, masked_values
from forge.losses.tis import sequence_tis_weights, tis_metrics, tis_weights

__all__ = ["grpo_loss", "gspo_loss", "ppo_clip_loss", "reinforce_loss"]

Metrics = dict[str, float]


def _check_shapes(mask_bt: torch.Tensor, **tensors_bt: torch.Tensor | None) -> None:
    for name, t in tensors_bt.items():
        if t is not None and t.shape != mask_bt.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask_bt has {tuple(mask_bt.shape)}"
            )


def _advantages_bt(advantages: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Per-sequence ``[B]`` or per-token ``[B, T]`` advantages as a detached ``[B, T]`` view."""
    if advantages.dim() == 1 and advantages.shape[0] == mask_bt.shape[0]:
        return masked_values(advantages.detach().unsqueeze(-1).expand_as(mask_bt), mask_bt)
    if advantages.shape == mask_bt.shape:
        return masked_values(advantages.detach(), mask_bt)
    raise ValueError(
        f"advantages must have shape [B]={mask_bt.shape[0]} or [B, T]={tuple(mask_bt.shape)}, "
        f"got {tuple(advantages.shape)}"
    )


def _clip_range(eps_low: float, eps_high: float | None) -> tuple[float, float]:
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got low={eps_low}, high={eps_high}")
    return 1.0 - eps_low, 1.0 + eps_high


def _check_dual_clip(clip_ratio_c: float | None) -> None:
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (verl uses 3.0) or None, got {clip_ratio_c}")


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp`` of the log-ratio clamped to ``[-20, 20]`` (finite, zero gradient past it)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    low: float,
    high: float,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element ``-min(r*A, clip(r)*A)`` (capped at ``-c*A`` where ``A < 0`` with a dual
    clip) and masks of where clipping zeroed the gradient: high, low, dual."""
    loss = torch.maximum(-ratio * adv, -ratio.clamp(low, high) * adv)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -clip_ratio_c * adv), loss)
    with torch.no_grad():
        clipped_high = (adv > 0) & (ratio > high)
        clipped_low = (adv < 0) & (ratio < low)
        clipped_dual = torch.zeros_like(clipped_high)
        if clip_ratio_c is not None:
            clipped_dual = (adv < 0) & (ratio > clip_ratio_c)
    return loss, clipped_high, clipped_low, clipped_dual


def _masked_inputs(mask_bt: torch.Tensor, *tensors_bt: torch.Tensor | None):
    """Each ``[B, T]`` tensor with its masked positions replaced by 0 (see module docstring)."""
    return tuple(None if t is None else masked_values(t, mask_bt) for t in tensors_bt)


def _clip_metrics(
    ratio: torch.Tensor,
    high: torch.Tensor,
    low: torch.Tensor,
    dual: torch.Tensor,
    weights: torch.Tensor,
    dual_on: bool,
) -> Metrics:
    """Ratio mean and clip fractions over the counted elements (``weights``)."""
    metrics = {
        "ratio_mean": masked_mean(ratio, weights).item(),
        "clip_fraction": masked_mean((high | low | dual).float(), weights).item(),
        "clip_high_fraction": masked_mean(high.float(), weights).item(),
        "clip_low_fraction": masked_mean(low.float(), weights).item(),
    }
    if dual_on:
        metrics["clip_dual_fraction"] = masked_mean(dual.float(), weights).item()
    return metrics


def ppo_clip_loss(
    logprobs_bt: torch.Tensor,
    old_logprobs_bt: torch.Tensor,
    advantages: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = None,
    generator_logprobs_bt: torch.Tensor | None = None,
    tis_cap: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip with token ratios; ``advantages`` is per sequence ``[B]`` or per token ``[B, T]``.

    ``clip_eps_high=None`` means symmetric clipping; ``clip_ratio_c`` adds the dual clip (module
    docstring). With ``tis_cap`` set, each token's loss is multiplied by the TIS weight
    ``min(exp(old - generator), tis_cap)`` (see ``forge.losses.tis``), which needs
    ``generator_logprobs_bt``.
    """
    _check_shapes(mask_bt, logprobs_bt=logprobs_bt, old_logprobs_bt=old_logprobs_bt)
    _check_dual_clip(clip_ratio_c)
    low, high = _clip_range(clip_eps_low, clip_eps_high)
    adv_bt = _advantages_bt(advantages, mask_bt)
    lp_bt, old_bt, gen_bt = _masked_inputs(
        mask_bt, logprobs_bt, old_logprobs_bt.detach(), generator_logprobs_bt
    )
    ratio_bt = _ratio(lp_bt - old_bt)
    loss_bt, high_bt, low_bt, dual_bt = _clipped_surrogate(
        ratio_bt, adv_bt, low, high, clip_ratio_c
    )
    metrics: Metrics = {}
    if tis_cap is not None:
        if gen_bt is None:
            raise ValueError("tis_cap is set but generator_logprobs_bt is None; pass both")
        _check_shapes(mask_bt, generator_logprobs_bt=gen_bt)
        loss_bt = loss_bt * tis_weights(old_bt, gen_bt, tis_cap)
        metrics.update(tis_metrics(old_bt, gen_bt, mask_bt, tis_cap))
    loss = aggregate(loss_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics["policy_loss"] = loss.item()
        metrics.update(
            _clip_metrics(ratio_bt, high_bt, low_bt, dual_bt, mask_bt, clip_ratio_c is not None)
        )
    return loss, metrics


def grpo_loss(
    logprobs_bt: torch.Tensor,
    generator_logprobs_bt: torch.Tensor,
    advantages_b: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    old_logprobs_bt: torch.Tensor | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = None,
    tis_cap: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GRPO: the clipped surrogate with one advantage per sequence ``[B]``, plus optional
    TIS. Per-token advantages ``[B, T]`` (credit over turns: each turn's advantage on its
    tokens) are taken as they are.

    The ratio's denominator is ``old_logprobs_bt`` (the trainer's logprobs at the weights that
    generated the batch) when given, else the generator's own ``generator_logprobs_bt`` (which
    then also makes every TIS weight 1). The KL-to-reference term is added by ``build_loss``.
    """
    old_bt = generator_logprobs_bt if old_logprobs_bt is None else old_logprobs_bt
    return ppo_clip_loss(
        logprobs_bt,
        old_bt,
        advantages_b,
        mask_bt,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        clip_ratio_c=clip_ratio_c,
        generator_logprobs_bt=generator_logprobs_bt,
        tis_cap=tis_cap,
        aggregation=aggregation,
        max_tokens=max_tokens,
    )


def reinforce_loss(
    logprobs_bt: torch.Tensor,
    advantages: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    old_logprobs_bt: torch.Tensor | None = None,
    generator_logprobs_bt: torch.Tensor | None = None,
    tis_cap: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """REINFORCE: ``-(A * logprobs)`` per token, advantages ``[B]`` or ``[B, T]``.

    Unbiased only on-policy (no ratio to old weights). ``tis_cap`` still corrects the
    generator/trainer mismatch with weights ``min(exp(old - generator), cap)``; without
    ``old_logprobs_bt`` those weights are 1.
    """
    _check_shapes(mask_bt, logprobs_bt=logprobs_bt)
    (lp_bt,) = _masked_inputs(mask_bt, logprobs_bt)
    loss_bt = -_advantages_bt(advantages, mask_bt) * lp_bt
    metrics: Metrics = {}
    if tis_cap is not None:
        if generator_logprobs_bt is None:
            raise ValueError("tis_cap is set but generator_logprobs_bt is None; pass both")
        old_bt = generator_logprobs_bt if old_logprobs_bt is None else old_logprobs_bt
        _check_shapes(mask_bt, old_logprobs_bt=old_bt, generator_logprobs_bt=generator_logprobs_bt)
        old_bt, gen_bt = _masked_inputs(mask_bt, old_bt.detach(), generator_logprobs_bt)
        loss_bt = loss_bt * tis_weights(old_bt, gen_bt, tis_cap)
        metrics.update(tis_metrics(old_bt, gen_bt, mask_bt, tis_cap))
    loss = aggregate(loss_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics.update(policy_loss=loss.item(), logprob_mean=masked_mean(lp_bt, mask_bt).item())
    return loss, metrics


def gspo_loss(
    logprobs_bt: torch.Tensor,
    generator_logprobs_bt: torch.Tensor,
    advantages_b: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    old_logprobs_bt: torch.Tensor | None = None,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    clip_ratio_c: float | None = None,
    tis_cap: float | None = None,
    aggregation: str = "seq_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al., 2025): one ratio per sequence, clipped per sequence.

    ``s_i = exp(mean over counted tokens of (logprobs - old))``, the geometric mean of the
    token ratios; ``loss_i = -min(s_i * A_i, clip(s_i) * A_i)``. The default clip range is
    the paper's (3e-4, 4e-4): sequence ratios stay much closer to 1 than token ratios.
    ``loss_i`` is spread over the sequence's tokens before ``aggregation``, so ``seq_mean``
    (the default, and the paper's) averages it over sequences. TIS, when set, is also per
    sequence (``forge.losses.tis.sequence_tis_weights``). ``old`` defaults to the generator's.

    That band is narrower than the generator/trainer mismatch: with ``old`` the generator's
    logprobs, a per-token noise of 0.005-0.02 nats already puts a sizeable share of long
    sequences outside it at step 0 (``clip_fraction`` reports the share of sequences whose
    gradient clipping zeroed, ``log_ratio_abs_mean`` the mean ``|log s_i|`` to set against
    the band). Use ``TrainerConfig.old_logprobs = "current"`` (the ratio is
    then exactly 1 at the update, the band binds only on genuine policy change) with
    ``tis_cap`` to correct the mismatch; see docs/rl_maths.md.
    """
    if advantages_b.dim() != 1 or advantages_b.shape[0] != mask_bt.shape[0]:
        raise ValueError(
            f"gspo_loss takes one advantage per sequence [B]={mask_bt.shape[0]}, got shape "
            f"{tuple(advantages_b.shape)}"
        )
    old_bt = generator_logprobs_bt if old_logprobs_bt is None else old_logprobs_bt
    _check_shapes(mask_bt, logprobs_bt=logprobs_bt, old_logprobs_bt=old_bt)
    _check_dual_clip(clip_ratio_c)
    low, high = _clip_range(clip_eps_low, clip_eps_high)
    mask_bt = mask_bt.to(logprobs_bt.dtype)
    lp_bt, old_bt, gen_bt = _masked_inputs(
        mask_bt, logprobs_bt, old_bt.detach(), generator_logprobs_bt
    )
    tokens_b = mask_bt.sum(dim=-1)
    log_ratio_b = ((lp_bt - old_bt) * mask_bt).sum(dim=-1) / tokens_b.clamp(min=1)
    ratio_b = _ratio(log_ratio_b)
    adv_b = advantages_b.detach().to(ratio_b.dtype)
    loss_b, high_b, low_b, dual_b = _clipped_surrogate(ratio_b, adv_b, low, high, clip_ratio_c)
    metrics: Metrics = {}
    if tis_cap is not None:
        _check_shapes(mask_bt, generator_logprobs_bt=gen_bt)
        w_b = sequence_tis_weights(old_bt, gen_bt, mask_bt, tis_cap)
        loss_b = loss_b * w_b
        metrics["tis_weight_mean"] = w_b[tokens_b > 0].mean().nan_to_num(1.0).item()
    loss = aggregate(loss_b.unsqueeze(-1).expand_as(mask_bt), mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics["policy_loss"] = loss.item()
        seqs_b = (tokens_b > 0).float()
        metrics.update(
            _clip_metrics(ratio_b, high_b, low_b, dual_b, seqs_b, clip_ratio_c is not None)
        )
        # Compare with the band (3e-4 / 4e-4): how far sequences sit from ratio 1.
        metrics["log_ratio_abs_mean"] = masked_mean(log_ratio_b.abs(), seqs_b).item()
    return loss, metrics
