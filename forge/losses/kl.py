"""Per-token estimators of KL(policy || reference) from tokens sampled by the policy.

Convention: ``p = logprobs_bt`` (the policy being trained), ``q = ref_logprobs_bt`` (the
frozen reference), both log-probabilities of the *sampled* tokens. With ``d = q - p``
(Schulman, "Approximating KL Divergence", 2020):

- ``k1 = p - q = -d``: unbiased, high variance, can be negative per token.
- ``k2 = 0.5 * (p - q)**2``: biased, low variance, always >= 0; its gradient is the one of
  the true KL to first order.
- ``k3 = exp(d) - d - 1``: unbiased and always >= 0 (GRPO's choice).
"""

from __future__ import annotations

import torch

__all__ = ["KL_ESTIMATORS", "kl_penalty"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(
    logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]``; gradients flow through ``logprobs_bt`` only.

    Masking and reduction are left to the caller (see ``forge.losses.aggregate``).
    """
    if logprobs_bt.shape != ref_logprobs_bt.shape:
        raise ValueError(
            f"logprobs_bt {tuple(logprobs_bt.shape)} and ref_logprobs_bt "
            f"{tuple(ref_logprobs_bt.shape)} must match"
        )
    log_ratio_bt = logprobs_bt - ref_logprobs_bt.detach()
    if estimator == "k1":
        return log_ratio_bt
    if estimator == "k2":
        return 0.5 * log_ratio_bt.square()
    if estimator == "k3":
        d_bt = -log_ratio_bt
        return torch.exp(d_bt) - d_bt - 1.0
    raise ValueError(f"unknown kl estimator: {estimator!r}; choose one of {KL_ESTIMATORS}")
