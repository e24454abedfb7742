"""Per-token estimators of KL(policy || reference) from tokens sampled by the policy.

Convention: ``p = logprobs_bt`` (the policy being trained), ``q = ref_logprobs_bt`` (the
frozen reference), both log-probabilities of the *sampled* tokens, ``r = q - p`` the log-ratio
(Schulman, "Approximating KL Divergence", 2020). What each estimator's *value* estimates and
what its *gradient* (through ``p``, tokens sampled from the policy) optimises are different
facts; only the gradient moves the policy:

- ``k1 = p - q = -r``: its value is unbiased for KL(pi || ref) but high variance and can be
  negative per token. Its expected gradient is **zero** (``E[grad log p] = 0``), so as a loss
  term it pulls the policy nowhere in expectation, only adds noise.
- ``k2 = 0.5 * r**2``: biased value, low variance, >= 0. Its gradient, ``(p - q) grad p``, is
  **exactly** the gradient of the reverse KL(pi || ref) (in expectation over the sampling).
- ``k3 = exp(r) - r - 1``: unbiased value, >= 0 (GRPO's choice). Its gradient,
  ``(1 - exp(r)) grad p``, is in expectation the gradient of the **forward** KL(ref || pi),
  not of KL(pi || ref) whose value it estimates.

The default (``LossConfig.kl_estimator = "k3"``) keeps GRPO's published choice: a forward-KL
pull that stays bounded below and is mode-covering toward the reference. ``k2`` is the one to
pick when the reverse KL's gradient is wanted.

Every estimator is computed on the positions where ``mask_bt`` is 1 only (``torch.where``:
elsewhere it is exactly 0, whatever the inputs hold there, so a prompt position's logprob of
-95 against a reference of 0 cannot overflow ``exp`` into ``inf * 0 = NaN``), and the
log-ratio is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` (20, as verl does) so a real
response token with a huge gap gives a large but finite value and a zero gradient past it.
That still lets one token's ``k3`` gradient reach ``e^20 - 1``; ``clamp``
(``LossConfig.kl_clamp``; verl clamps ``k3`` at 10) bounds each token's value to ``[-clamp,
clamp]`` with a zero gradient past it: at 10, a ``k3`` token's gradient is at most
``e^2.61 - 1 = 12.6`` (the value reaches 10 at ``r = 2.61``).

Forge has the KL only as a loss term (``LossConfig.kl_coef``); there is no KL-in-reward
(InstructGPT's / verl's ``use_kl_in_reward``, a per-token ``-beta * KL`` added to the
critic's rewards). See docs/rl_maths.md.
"""

from __future__ import annotations

import torch

from forge.losses.normalize import masked_values

__all__ = ["KL_ESTIMATORS", "LOG_RATIO_CLAMP", "k1", "k2", "k3", "kl_penalty"]

KL_ESTIMATORS = ("k1", "k2", "k3")
# verl's bound on log-ratios before exp: exp(20) ~ 4.9e8 is finite in float32 and bf16.
LOG_RATIO_CLAMP = 20.0


def _log_ratio(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``clamp(q - p, -20, 20)``, gradient through ``p`` only."""
    return (ref_logprobs_bt.detach() - logprobs_bt).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def k1(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``p - q``: unbiased value, high variance; zero expected gradient."""
    return -_log_ratio(logprobs_bt, ref_logprobs_bt)


def k2(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``0.5 * (p - q)**2``: biased value, >= 0; its gradient is the reverse KL's exactly."""
    return 0.5 * _log_ratio(logprobs_bt, ref_logprobs_bt).square()


def k3(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor) -> torch.Tensor:
    """``exp(q - p) - (q - p) - 1``: unbiased value, >= 0; its gradient is the forward
    KL(ref || pi)'s in expectation."""
    d_bt = _log_ratio(logprobs_bt, ref_logprobs_bt)
    return torch.exp(d_bt) - d_bt - 1.0


def kl_penalty(
    logprobs_bt: torch.Tensor,
    ref_logprobs_bt: torch.Tensor,
    estimator="k3",
    mask_bt: torch.Tensor | None = None,
    clamp: float | None = None,
) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]``; gradients flow through ``logprobs_bt`` only.

    ``estimator`` is a built-in name, an import string ``pkg.module:fn`` or a callable
    ``fn(logprobs_bt, ref_logprobs_bt) -> kl_bt`` (see ``forge.slots.KL``). With ``mask_bt``
    the estimate is computed on the counted positions only and is exactly 0 (no gradient)
    elsewhere: both inputs are replaced by 0 there *before* the estimator runs, so masked
    values of any size (or NaN) cannot leak in. ``clamp`` (> 0) bounds each token's estimate
    to ``[-clamp, clamp]``, with a zero gradient where it binds (``None``: no bound).
    Reduction is left to the caller (``forge.losses.aggregate``).
    """
    if clamp is not None and not clamp > 0:
        raise ValueError(f"KL clamp must be > 0 or None, got {clamp}")
    if logprobs_bt.shape != ref_logprobs_bt.shape:
        raise ValueError(
            f"logprobs_bt {tuple(logprobs_bt.shape)} and ref_logprobs_bt "
            f"{tuple(ref_logprobs_bt.shape)} must match"
        )
    if mask_bt is not None:
        logprobs_bt = masked_values(logprobs_bt, mask_bt)
        ref_logprobs_bt = masked_values(ref_logprobs_bt, mask_bt)
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
    if clamp is not None:
        kl_bt = kl_bt.clamp(-clamp, clamp)
    if mask_bt is not None:
        kl_bt = masked_values(kl_bt, mask_bt)
    return kl_bt
