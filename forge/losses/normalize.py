"""Reduce a per-token loss ``[B, T]`` to the scalar that is back-propagated.

The choice changes how much each token and each sequence weighs in the gradient:

``token_mean``
    ``sum(loss * mask) / sum(mask)``: every token of the batch weighs the same (DAPO's
    "token-level" loss). Long responses contribute more tokens, hence more gradient.
``seq_mean``
    Mean over each sequence's tokens, then mean over sequences (the original GRPO paper):
    every sequence weighs the same, so a token of a short response weighs more than one of a
    long response. Rows with no counted token are left out of the batch mean.
``dr_grpo``
    ``sum(loss * mask) / (B * max_tokens)`` with a *constant* ``max_tokens`` (Dr.GRPO): no
    per-sequence length normalisation, so no length bias, and the scale does not depend on the
    batch's lengths.

Masked positions are selected out with ``torch.where``, never multiplied by 0: a masked
value of ``inf`` or ``NaN`` (an overflowed ratio on a prompt position) would otherwise turn
the sum into ``NaN`` (``inf * 0``).
"""

from __future__ import annotations

import torch

__all__ = ["AGGREGATION_MODES", "aggregate", "masked_mean", "masked_values"]

AGGREGATION_MODES = ("token_mean", "seq_mean", "dr_grpo")


def masked_values(values_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """``values_bt`` where ``mask_bt`` is nonzero, exactly 0 elsewhere (and no gradient flows
    to the masked positions, whatever they hold: ``where``'s backward never multiplies)."""
    return torch.where(mask_bt != 0, values_bt, torch.zeros_like(values_bt))


def masked_mean(values_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Mean of ``values_bt`` over positions where ``mask_bt`` is 1 (0 if the mask is empty)."""
    mask_bt = mask_bt.to(values_bt.dtype)
    return (masked_values(values_bt, mask_bt) * mask_bt).sum() / mask_bt.sum().clamp(min=1.0)


def aggregate(
    loss_bt: torch.Tensor, mask_bt: torch.Tensor, mode: str, max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce ``loss_bt`` over the tokens where ``mask_bt`` is 1, as ``mode`` says.

    ``mode`` is one of ``AGGREGATION_MODES`` (see the module docstring). ``max_tokens`` is only
    used by ``dr_grpo``: pass the generation length limit so the divisor is the same every
    step; when ``None`` it falls back to the padded width ``T`` of this batch.
    """
    if loss_bt.shape != mask_bt.shape:
        raise ValueError(
            f"loss_bt {tuple(loss_bt.shape)} and mask_bt {tuple(mask_bt.shape)} must match"
        )
    mask_bt = mask_bt.to(loss_bt.dtype)
    loss_bt = masked_values(loss_bt, mask_bt)
    if mode == "token_mean":
        return masked_mean(loss_bt, mask_bt)
    if mode == "seq_mean":
        tokens_b = mask_bt.sum(dim=-1)
        per_seq_b = (loss_bt * mask_bt).sum(dim=-1) / tokens_b.clamp(min=1.0)
        return per_seq_b.sum() / (tokens_b > 0).sum().clamp(min=1)
    if mode == "dr_grpo":
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        width = max_tokens if max_tokens is not None else loss_bt.shape[-1]
        return (loss_bt * mask_bt).sum() / (loss_bt.shape[0] * width)
    raise ValueError(f"unknown aggregation mode: {mode!r}; choose one of {AGGREGATION_MODES}")
