"""Group-relative advantages: one scalar per completion, computed from the group's rewards.

Rewards arrive flat, ``rewards_b`` of shape ``[B]``, with each prompt's ``group_size``
completions *consecutive* (rows ``[g*G, (g+1)*G)`` form group ``g``). Every function returns
advantages of the same shape, in the same order (float32).

A group whose rewards are all equal gets advantage exactly 0 for every member, from every
estimator. "All equal" is relative to the rewards' scale: the spread ``max - min`` is at most
``rtol`` times the group's largest ``|r|`` (``EQUAL_RTOL``, about 8 float32 ulps), the same
test as ``zero_variance_group_fraction``, so multiplying every reward by 1e-6 or 1e6 changes
no group's verdict. Without that rule the float32 group mean of equal rewards can sit one ulp
off (1.2 x 8), and GRPO then divides that ulp by a std of about ``eps``: advantages of +/-0.1,
all one sign, from a group that carries no signal. The centring itself runs in float64.
"""

from __future__ import annotations

import torch

__all__ = [
    "dr_grpo_advantages",
    "grpo_advantages",
    "rloo_advantages",
    "zero_variance_group_fraction",
]


# Groups whose reward spread is at most this times their largest |reward| are "all equal":
# zero advantage. One float32 ulp is at most 1.2e-7 of the value: rewards that differ only by
# rounding are equal, rewards that differ by more than a millionth of their size are not.
EQUAL_RTOL = 1e-6


def _grouped(rewards_b: torch.Tensor, group_size: int) -> torch.Tensor:
    """View ``[B]`` rewards as ``[B // group_size, group_size]``, float64, after checking
    shapes."""
    if rewards_b.dim() != 1:
        raise ValueError(f"rewards_b must be 1-D [batch], got shape {tuple(rewards_b.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards_b.numel() % group_size != 0:
        raise ValueError(
            f"batch of {rewards_b.numel()} rewards is not a whole number of groups of "
            f"{group_size}; pass all completions of each prompt together"
        )
    return rewards_b.double().reshape(-1, group_size)


def _all_equal(r_gk: torch.Tensor, rtol: float) -> torch.Tensor:
    """``[G, 1]`` bool: the groups whose spread is at most ``rtol`` times their largest
    ``|r|`` (all-zero groups included)."""
    spread_g1 = r_gk.max(dim=1, keepdim=True).values - r_gk.min(dim=1, keepdim=True).values
    return spread_g1 <= rtol * r_gk.abs().max(dim=1, keepdim=True).values


def _finish(adv_gk: torch.Tensor, r_gk: torch.Tensor, rtol: float) -> torch.Tensor:
    """Flat float32 advantages, exactly 0 in groups whose rewards are all equal."""
    adv_gk = torch.where(_all_equal(r_gk, rtol), torch.zeros_like(adv_gk), adv_gk)
    return adv_gk.float().reshape(-1)


def grpo_advantages(
    rewards_b: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    unbiased: bool = False,
    rtol: float = EQUAL_RTOL,
) -> torch.Tensor:
    """GRPO advantages: ``(r - group mean) / (group std + eps)``.

    The std is the *population* std (divide by ``G``) by default: it is the z-score of the
    reward within its group, is defined for ``group_size=1`` and matches Dr.GRPO's analysis.
    ``unbiased=True`` divides by ``G - 1`` instead, as ``torch.std`` (and TRL / verl) do; for
    a group of 4 that scales every advantage by ``sqrt(3/4)``. A group whose rewards are all
    equal (within ``rtol`` of their scale) gets advantage exactly 0 for every member (no signal, no NaN).
    """
    r_gk = _grouped(rewards_b, group_size)
    if unbiased and group_size < 2:
        raise ValueError("unbiased std needs group_size >= 2; use unbiased=False")
    mean_g1 = r_gk.mean(dim=1, keepdim=True)
    std_g1 = r_gk.std(dim=1, keepdim=True, unbiased=unbiased)
    return _finish((r_gk - mean_g1) / (std_g1 + eps), r_gk, rtol)


def dr_grpo_advantages(
    rewards_b: torch.Tensor, group_size: int, rtol: float = EQUAL_RTOL
) -> torch.Tensor:
    """Dr.GRPO advantages: ``r - group mean``, with no std division.

    Dividing by the std up-weights groups that are nearly all right or all wrong (low std);
    Dr.GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training") drops it to remove that
    question-difficulty bias.
    """
    r_gk = _grouped(rewards_b, group_size)
    return _finish(r_gk - r_gk.mean(dim=1, keepdim=True), r_gk, rtol)


def rloo_advantages(
    rewards_b: torch.Tensor, group_size: int, rtol: float = EQUAL_RTOL
) -> torch.Tensor:
    """REINFORCE leave-one-out: ``r_i - mean_{j != i} r_j`` within each group.

    The baseline for each sample excludes that sample, so it is independent of the sample's
    own action (an unbiased baseline). Equals ``G / (G - 1) * (r_i - group mean)``.
    """
    if group_size < 2:
        raise ValueError(f"rloo_advantages needs group_size >= 2, got {group_size}")
    r_gk = _grouped(rewards_b, group_size)
    baseline_gk = (r_gk.sum(dim=1, keepdim=True) - r_gk) / (group_size - 1)
    return _finish(r_gk - baseline_gk, r_gk, rtol)


def zero_variance_group_fraction(
    rewards_b: torch.Tensor, group_size: int, rtol: float = EQUAL_RTOL
) -> float:
    """Fraction of groups whose rewards are all equal (within ``rtol`` of their scale): they
    carry no signal.

    A rising value means the task is too easy or too hard for the policy (DAPO filters such
    groups out, "dynamic sampling").
    """
    r_gk = _grouped(rewards_b, group_size)
    return _all_equal(r_gk, rtol).float().mean().item()
