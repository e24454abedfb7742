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
"""

from __future__ import annotations

import torch

from forge.losses.normalize import aggregate, masked_mean
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
        return advantages.detach().unsqueeze(-1).expand_as(mask_bt)
    if advantages.shape == mask_bt.shape:
        return advantages.detach()
    raise ValueError(
        f"advantages must have shape [B]={mask_bt.shape[0]} or [B, T]={tuple(mask_bt.shape)}, "
        f"got {tuple(advantages.shape)}"
    )


def _clip_range(eps_low: float, eps_high: float | None) -> tuple[float, float]:
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got low={eps_low}, high={eps_high}")
    return 1.0 - eps_low, 1.0 + eps_high


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element ``-min(r*A, clip(r)*A)`` and masks of where clipping zeroed the gradient."""
    loss = torch.maximum(-ratio * adv, -ratio.clamp(low, high) * adv)
    with torch.no_grad():
        clipped_high = (adv > 0) & (ratio > high)
        clipped_low = (adv < 0) & (ratio < low)
    return loss, clipped_high, clipped_low


def ppo_clip_loss(
    logprobs_bt: torch.Tensor,
    old_logprobs_bt: torch.Tensor,
    advantages: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    generator_logprobs_bt: torch.Tensor | None = None,
    tis_cap: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO-clip with token ratios; ``advantages`` is per sequence ``[B]`` or per token ``[B, T]``.

    ``clip_eps_high=None`` means symmetric clipping. With ``tis_cap`` set, each token's loss
    is multiplied by the TIS weight ``min(exp(old - generator), tis_cap)`` (see
    ``forge.losses.tis``), which needs ``generator_logprobs_bt``.
    """
    _check_shapes(mask_bt, logprobs_bt=logprobs_bt, old_logprobs_bt=old_logprobs_bt)
    low, high = _clip_range(clip_eps_low, clip_eps_high)
    adv_bt = _advantages_bt(advantages, mask_bt)
    ratio_bt = torch.exp(logprobs_bt - old_logprobs_bt.detach())
    loss_bt, clipped_high_bt, clipped_low_bt = _clipped_surrogate(ratio_bt, adv_bt, low, high)
    metrics: Metrics = {}
    if tis_cap is not None:
        if generator_logprobs_bt is None:
            raise ValueError("tis_cap is set but generator_logprobs_bt is None; pass both")
        _check_shapes(mask_bt, generator_logprobs_bt=generator_logprobs_bt)
        loss_bt = loss_bt * tis_weights(old_logprobs_bt, generator_logprobs_bt, tis_cap)
        metrics.update(tis_metrics(old_logprobs_bt, generator_logprobs_bt, mask_bt, tis_cap))
    loss = aggregate(loss_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics.update(
            policy_loss=loss.item(),
            ratio_mean=masked_mean(ratio_bt, mask_bt).item(),
            clip_fraction=masked_mean((clipped_high_bt | clipped_low_bt).float(), mask_bt).item(),
            clip_high_fraction=masked_mean(clipped_high_bt.float(), mask_bt).item(),
            clip_low_fraction=masked_mean(clipped_low_bt.float(), mask_bt).item(),
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
    loss_bt = -_advantages_bt(advantages, mask_bt) * logprobs_bt
    metrics: Metrics = {}
    if tis_cap is not None:
        if generator_logprobs_bt is None:
            raise ValueError("tis_cap is set but generator_logprobs_bt is None; pass both")
        old_bt = generator_logprobs_bt if old_logprobs_bt is None else old_logprobs_bt
        _check_shapes(mask_bt, old_logprobs_bt=old_bt, generator_logprobs_bt=generator_logprobs_bt)
        loss_bt = loss_bt * tis_weights(old_bt, generator_logprobs_bt, tis_cap)
        metrics.update(tis_metrics(old_bt, generator_logprobs_bt, mask_bt, tis_cap))
    loss = aggregate(loss_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics.update(
            policy_loss=loss.item(), logprob_mean=masked_mean(logprobs_bt, mask_bt).item()
        )
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
    """
    if advantages_b.dim() != 1 or advantages_b.shape[0] != mask_bt.shape[0]:
        raise ValueError(
            f"gspo_loss takes one advantage per sequence [B]={mask_bt.shape[0]}, got shape "
            f"{tuple(advantages_b.shape)}"
        )
    old_bt = generator_logprobs_bt if old_logprobs_bt is None else old_logprobs_bt
    _check_shapes(mask_bt, logprobs_bt=logprobs_bt, old_logprobs_bt=old_bt)
    low, high = _clip_range(clip_eps_low, clip_eps_high)
    mask_bt = mask_bt.to(logprobs_bt.dtype)
    tokens_b = mask_bt.sum(dim=-1)
    log_ratio_b = ((logprobs_bt - old_bt.detach()) * mask_bt).sum(dim=-1) / tokens_b.clamp(min=1)
    ratio_b = torch.exp(log_ratio_b)
    adv_b = advantages_b.detach().to(ratio_b.dtype)
    loss_b, clipped_high_b, clipped_low_b = _clipped_surrogate(ratio_b, adv_b, low, high)
    metrics: Metrics = {}
    if tis_cap is not None:
        _check_shapes(mask_bt, generator_logprobs_bt=generator_logprobs_bt)
        w_b = sequence_tis_weights(old_bt, generator_logprobs_bt, mask_bt, tis_cap)
        loss_b = loss_b * w_b
        metrics["tis_weight_mean"] = w_b[tokens_b > 0].mean().nan_to_num(1.0).item()
    loss = aggregate(loss_b.unsqueeze(-1).expand_as(mask_bt), mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        seqs_b = (tokens_b > 0).float()
        metrics.update(
            policy_loss=loss.item(),
            ratio_mean=masked_mean(ratio_b, seqs_b).item(),
            clip_fraction=masked_mean((clipped_high_b | clipped_low_b).float(), seqs_b).item(),
            clip_high_fraction=masked_mean(clipped_high_b.float(), seqs_b).item(),
            clip_low_fraction=masked_mean(clipped_low_b.float(), seqs_b).item(),
        )
    return loss, metrics
