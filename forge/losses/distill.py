"""On-policy distillation (OPD): a teacher's per-token signal on the student's own samples.

The student (the policy) samples a response; a frozen teacher scores the same tokens in one
prefill. With, at each counted response position ``t``,

    s_t = log p_student(a_t | x, a_<t)      the generator's logprob of the sampled token
    q_t = log p_teacher(a_t | x', a_<t)     the teacher's, after its own prompt x' (x itself
                                            unless the teacher is shown a privileged prompt)

``k_t = s_t - q_t`` is the per-token estimate of the reverse KL, KL(student || teacher), at
that position: its expectation over the student's sampling is the KL there, and it is a
constant to the loss (no gradient flows through it). The distillation advantage is

    d_t = -coef * sum_{u >= t, counted} discount**(u - t) * k_u

With ``discount = 0`` each token gets only its own ``-coef * k_t`` (the default of
tinker-cookbook's on-policy distillation, ``kl_discount_factor: 0``); ``discount = 1`` gives
each token the whole rest of the response's ``-k``, the return of a per-token reward ``-k``,
whose policy gradient is the sequence-level reverse KL's. Signs: a token the teacher finds
likelier than the student (``k_t < 0``) gets a positive advantage and is pushed up, one the
teacher finds less likely is pushed down; a policy-gradient loss ``-d_t * log p(a_t)`` then
descends the reverse KL in expectation (``E[(s - q) grad s] = grad KL``, since
``E[grad s] = 0``). Mixed with rewards, a token's advantage is the reward's advantage of its
response plus ``d_t``.

Tensors are ``[B, T]`` with ``mask_bt`` 1.0 on the counted (response) tokens; every function
returns exactly 0 at masked positions.
"""

from __future__ import annotations

import torch

from forge.losses.normalize import masked_mean, masked_values

__all__ = [
    "discounted_future_sum",
    "distill_advantages",
    "distill_share",
    "reverse_kl",
    "teacher_kl",
]


def _check(mask_bt: torch.Tensor, **tensors_bt: torch.Tensor) -> None:
    for name, t in tensors_bt.items():
        if t.shape != mask_bt.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask_bt has {tuple(mask_bt.shape)}"
            )


def reverse_kl(
    student_logprobs_bt: torch.Tensor, teacher_logprobs_bt: torch.Tensor, mask_bt: torch.Tensor
) -> torch.Tensor:
    """``k_t = s_t - q_t`` on counted tokens, 0 elsewhere; detached (a constant to a loss)."""
    _check(
        mask_bt, student_logprobs_bt=student_logprobs_bt, teacher_logprobs_bt=teacher_logprobs_bt
    )
    diff_bt = student_logprobs_bt.detach().float() - teacher_logprobs_bt.detach().float()
    return masked_values(diff_bt, mask_bt)


def discounted_future_sum(values_bt: torch.Tensor, discount: float) -> torch.Tensor:
    """``y_t = x_t + discount * y_{t+1}`` along the last axis (a reversed, discounted cumulative
    sum; ``y_T = x_T``). ``discount = 0`` returns ``x``; ``discount = 1`` the suffix sums."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    if discount == 0.0:
        return values_bt.clone()
    out_bt = torch.empty_like(values_bt)
    running_b = torch.zeros_like(values_bt[..., 0])
    for t in range(values_bt.shape[-1] - 1, -1, -1):
        running_b = values_bt[..., t] + discount * running_b
        out_bt[..., t] = running_b
    return out_bt


def distill_advantages(
    student_logprobs_bt: torch.Tensor,
    teacher_logprobs_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    coef: float = 1.0,
    discount: float = 0.0,
) -> torch.Tensor:
    """``d_t = -coef * discounted_future_sum(k)_t`` on counted tokens (see the module), float32,
    0 at masked positions. Masked positions inside a row contribute nothing to the sums."""
    k_bt = reverse_kl(student_logprobs_bt, teacher_logprobs_bt, mask_bt)
    return masked_values(-coef * discounted_future_sum(k_bt, discount), mask_bt)


def teacher_kl(
    student_logprobs_bt: torch.Tensor, teacher_logprobs_bt: torch.Tensor, mask_bt: torch.Tensor
) -> float:
    """The mean of ``k_t`` over the counted tokens: the sampled estimate of KL(student ||
    teacher) per token (0 for an empty mask)."""
    k_bt = reverse_kl(student_logprobs_bt, teacher_logprobs_bt, mask_bt)
    return masked_mean(k_bt, mask_bt).item()


def distill_share(
    reward_advantages_bt: torch.Tensor, distill_advantages_bt: torch.Tensor, mask_bt: torch.Tensor
) -> float:
    """The distillation term's share of the advantage's magnitude on the counted tokens:
    ``sum |d| / (sum |reward advantage| + sum |d|)``; 1.0 for pure distillation, 0.0 when
    both are 0 everywhere."""
    _check(mask_bt, reward_advantages_bt=reward_advantages_bt, distill_bt=distill_advantages_bt)
    d = masked_values(distill_advantages_bt.abs(), mask_bt).sum()
    r = masked_values(reward_advantages_bt.abs(), mask_bt).sum()
    total = (d + r).item()
    return d.item() / total if total > 0 else 0.0
