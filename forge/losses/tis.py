"""Truncated importance sampling (TIS) for the generator / trainer mismatch.

The generator (e.g. vLLM) and the trainer compute slightly different probabilities for the
same weights and tokens (different kernels, precisions, batch shapes), so samples are
effectively drawn from ``pi_generator`` while the loss assumes ``pi_old`` (the trainer's own
probabilities at the weights that generated them). TIS reweights each token by

    w_t = min(pi_old(a_t) / pi_generator(a_t), C) = min(exp(old_t - generator_t), C)

detached from the graph (a correction of the sampling distribution, not something to
optimise), and capped at ``C`` to bound the variance (Yao et al., "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training", 2025). When the trainer's old
logprobs are not available, ``old = generator`` and every weight is 1.
"""

from __future__ import annotations

import torch

from forge.losses.normalize import masked_mean

__all__ = ["sequence_tis_weights", "tis_metrics", "tis_weights"]


def _check_cap(cap: float) -> None:
    if not cap > 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")


def tis_weights(
    old_logprobs_bt: torch.Tensor, generator_logprobs_bt: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token weights ``min(exp(old - generator), cap)``, shape ``[B, T]``, detached."""
    _check_cap(cap)
    if old_logprobs_bt.shape != generator_logprobs_bt.shape:
        raise ValueError(
            f"old_logprobs_bt {tuple(old_logprobs_bt.shape)} and generator_logprobs_bt "
            f"{tuple(generator_logprobs_bt.shape)} must match"
        )
    log_w_bt = (old_logprobs_bt - generator_logprobs_bt).detach()
    return torch.exp(log_w_bt).clamp(max=cap)


def sequence_tis_weights(
    old_logprobs_bt: torch.Tensor,
    generator_logprobs_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cap: float,
) -> torch.Tensor:
    """Per-sequence weights ``min(exp(mean_t(old - generator)), cap)``, shape ``[B]``, detached.

    The geometric-mean ratio over the sequence's counted tokens, matching GSPO's
    sequence-level ratio (a product of per-token ratios would explode with length).
    """
    _check_cap(cap)
    mask_bt = mask_bt.to(old_logprobs_bt.dtype)
    log_w_bt = (old_logprobs_bt - generator_logprobs_bt).detach() * mask_bt
    log_w_b = log_w_bt.sum(dim=-1) / mask_bt.sum(dim=-1).clamp(min=1.0)
    return torch.exp(log_w_b).clamp(max=cap)


@torch.no_grad()
def tis_metrics(
    old_logprobs_bt: torch.Tensor,
    generator_logprobs_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    cap: float,
) -> dict[str, float]:
    """Mean capped weight and the fraction of counted tokens whose raw ratio exceeded ``cap``."""
    raw_bt = torch.exp(old_logprobs_bt - generator_logprobs_bt)
    return {
        "tis_weight_mean": masked_mean(raw_bt.clamp(max=cap), mask_bt).item(),
        "tis_capped_fraction": masked_mean((raw_bt > cap).float(), mask_bt).item(),
    }
