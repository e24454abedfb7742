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

__all__ = ["KL_ESTIMATORS", "k1", "k2", "k3", "kl_penalty"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def k1(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``p - q``: unbiased, high variance."""
    return logprobs_bt - ref_logprobs_bt.detach()


def k2(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``0.5 * (p - q)**2``: biased, low variance, >= 0."""
    return 0.5 * k1(logprobs_bt, ref_logprobs_bt).square()


def k3(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``exp(q - p) - (q - p) - 1``: unbiased and >= 0."""
    d_bt = -k1(logprobs_bt, ref_logprobs_bt)
    return torch.exp(d_bt) - d_bt - 1.0


def kl_penalty(
    logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor, estimator="k3"
) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]``; gradients flow through ``logprobs_bt`` only.

    ``estimator`` is a built-in name, an import string ``pkg.module:fn`` or a callable
    ``fn(logprobs_bt, ref_logprobs_bt) -> kl_bt`` (see ``forge.slots.KL``). Masking and
    reduction are left to the caller (see ``forge.losses.aggregate``).
    """
    if logprobs_bt.shape != ref_logprobs_bt.shape:
        raise ValueError(
            f"logprobs_bt {tuple(logprobs_bt.shape)} and ref_logprobs_bt "
            f"{tuple(ref_logprobs_bt.shape)} must match"
        )
    fn = {"k1": k1, "k2": k2, "k3": k3}.get(estimator) if isinstance(estimator, str) else None
    if fn is None:
        from forge.slots import KL

        fn = KL.resolve(estimator, key="kl_estimator")
    kl_bt = fn(logprobs_bt, ref_logprobs_bt)
    if kl_bt.shape != logprobs_bt.shape:
        raise ValueError(
            f"KL estimator {estimator!r} returned shape {tuple(kl_bt.shape)}, expected "
            f"{tuple(logprobs_bt.shape)}"
        )
    return kl_bt
