"""GKD: a distillation loss against the teacher's top-k logprobs (generalized JSD, TRL's).

The student samples a response; the teacher, in one prefill of it, returns at each response
position ``t`` its ``k`` likeliest next tokens ``i_1..i_k`` and their logprobs (of the
teacher's full-vocabulary softmax at the policy's temperature). Both models' distributions
are then coarsened to ``k + 1`` outcomes: each of those ``k`` ids, and "any other token"
(the tail), with the mass each model's full softmax gives them:

    T_t = [p_T(i_1), ..., p_T(i_k), 1 - sum_j p_T(i_j)]
    S_t = [p_S(i_1), ..., p_S(i_k), 1 - sum_j p_S(i_j)]    (p_S at the same temperature)

No renormalisation: a student that moves mass onto the teacher's top-k lowers the loss, as
it does the full-vocabulary divergence (which the coarsened one never exceeds, and equals at
``k = vocab``). The tail's mass is floored at ``TAIL_FLOOR`` so its log and gradient stay
finite when the top-k holds (numerically) all of it. The per-token loss is the generalized
Jensen-Shannon divergence of GKD (Agarwal et al., "On-Policy Distillation of Language
Models", eq. 1; TRL's ``GKDTrainer.generalized_jsd_loss``) with ``M = beta * T + (1 - beta) * S``:

    beta = 0         KL(T || S)                                   forward KL
    0 < beta < 1     beta * KL(T || M) + (1 - beta) * KL(S || M)  generalized JSD
    beta = 1         KL(S || T)                                   reverse KL

(the two ends are special-cased, as TRL does: the mixture form goes to 0 at either end; a
``beta`` within 1e-6 of an end is taken as 1e-6 from it). Gradients flow to the student's
logprobs only. Tensors: ``[B, T, K]`` for the top-k (a ``-inf`` teacher logprob marks a
padding slot, when rows of one batch have different ``k``; the student's slot there is
ignored), ``[B, T]`` for the mask; masked positions give exactly 0.
"""

from __future__ import annotations

import math

import torch

from forge.losses.normalize import masked_values

__all__ = ["generalized_jsd", "topk_forward_kl", "topk_reverse_kl"]

TAIL_FLOOR = 1.0e-6  # the least mass the tail is given (see the module)
_FILL = -1.0e9  # an invalid slot's logit: no mass, and finite where a gradient passes


def _check(student_btk: torch.Tensor, teacher_btk: torch.Tensor, mask_bt: torch.Tensor) -> None:
    if student_btk.shape != teacher_btk.shape:
        raise ValueError(
            f"student top-k logprobs {tuple(student_btk.shape)} and teacher top-k logprobs "
            f"{tuple(teacher_btk.shape)} must have the same [B, T, K] shape"
        )
    if student_btk.shape[:-1] != mask_bt.shape:
        raise ValueError(
            f"top-k tensors {tuple(student_btk.shape)} do not match mask_bt {tuple(mask_bt.shape)}"
        )


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate at both ends."""
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _coarsened(student_btk, teacher_btk, mask_bt):
    """Both distributions over the ``k`` slots and the tail as log-probs ``[B, T, K + 1]``,
    and the valid slots (the tail always). Invalid slots hold a large finite negative value
    in both (exactly 0 mass, no ``inf - inf`` in a gradient); at a masked position both are
    the same constant distribution, disconnected from the student."""
    _check(student_btk, teacher_btk, mask_bt)
    counted_bt = mask_bt != 0
    valid_btk = torch.isfinite(teacher_btk) & counted_bt.unsqueeze(-1)
    fill = torch.full(student_btk.shape, _FILL, dtype=torch.float32, device=student_btk.device)
    t = torch.where(valid_btk, teacher_btk.detach().float(), fill)
    s = torch.where(valid_btk, student_btk.float(), fill)
    ceiling = math.log1p(-TAIL_FLOOR)  # the top-k's log-mass, at most 1 - TAIL_FLOOR

    def with_tail(lp_btk: torch.Tensor) -> torch.Tensor:
        top_bt = torch.logsumexp(lp_btk, -1).clamp(max=ceiling)
        tail_bt = torch.where(counted_bt, _log1mexp(top_bt), torch.zeros_like(top_bt))
        return torch.cat([lp_btk, tail_bt.unsqueeze(-1)], -1)

    valid_btk = torch.cat([valid_btk, torch.ones_like(valid_btk[..., :1])], -1)
    return with_tail(s), with_tail(t), valid_btk


def _kl(log_p_btk, log_q_btk, valid_btk) -> torch.Tensor:
    """``KL(p || q)`` summed over the valid slots, ``[B, T]``."""
    term = log_p_btk.exp() * (log_p_btk - log_q_btk)
    return torch.where(valid_btk, term, torch.zeros_like(term)).sum(-1)


def generalized_jsd(
    student_logprobs_btk: torch.Tensor,
    teacher_logprobs_btk: torch.Tensor,
    mask_bt: torch.Tensor,
    beta: float | torch.Tensor,
) -> torch.Tensor:
    """The per-token divergence ``[B, T]`` of the module (0 at masked positions).

    ``student_logprobs_btk``: the student's full-vocabulary logprobs (at the temperature) of
    the teacher's top-k ids, with grad; ``teacher_logprobs_btk``: the teacher's logprobs of
    them (detached here); ``beta``: a float in ``[0, 1]`` or a ``[B]`` tensor (one per row, e.g.
    rows scored by teachers with different settings)."""
    beta_b = torch.as_tensor(beta, dtype=torch.float32, device=student_logprobs_btk.device)
    if beta_b.dim() == 0:
        beta_b = beta_b.expand(student_logprobs_btk.shape[0])
    if beta_b.shape != student_logprobs_btk.shape[:1]:
        raise ValueError(f"beta must be a float or one per row, got shape {tuple(beta_b.shape)}")
    if bool(((beta_b < 0) | (beta_b > 1)).any()):
        raise ValueError(f"beta must be in [0, 1], got {beta_b.tolist()}")
    log_s, log_t, valid = _coarsened(student_logprobs_btk, teacher_logprobs_btk, mask_bt)
    forward_bt = _kl(log_t, log_s, valid)  # KL(T || S)
    reverse_bt = _kl(log_s, log_t, valid)  # KL(S || T)
    b = beta_b.view(-1, 1, 1)
    inner = b.clamp(1e-6, 1 - 1e-6)  # the mixture's logs stay finite; ends are chosen below
    log_m = torch.logsumexp(torch.stack([log_s + torch.log1p(-inner), log_t + torch.log(inner)]), 0)
    mixed_bt = inner.view(-1, 1) * _kl(log_t, log_m, valid) + (1 - inner.view(-1, 1)) * _kl(
        log_s, log_m, valid
    )
    b_bt = beta_b.view(-1, 1).expand_as(mixed_bt)
    out_bt = torch.where(b_bt == 0, forward_bt, torch.where(b_bt == 1, reverse_bt, mixed_bt))
    return masked_values(out_bt, mask_bt)


def topk_forward_kl(student_logprobs_btk, teacher_logprobs_btk, mask_bt) -> torch.Tensor:
    """``KL(T || S)`` per token over the teacher's top-k and the tail (``beta = 0``)."""
    log_s, log_t, valid = _coarsened(student_logprobs_btk, teacher_logprobs_btk, mask_bt)
    return masked_values(_kl(log_t, log_s, valid), mask_bt)


def topk_reverse_kl(student_logprobs_btk, teacher_logprobs_btk, mask_bt) -> torch.Tensor:
    """``KL(S || T)`` per token over the teacher's top-k and the tail (``beta = 1``)."""
    log_s, log_t, valid = _coarsened(student_logprobs_btk, teacher_logprobs_btk, mask_bt)
    return masked_values(_kl(log_s, log_t, valid), mask_bt)
