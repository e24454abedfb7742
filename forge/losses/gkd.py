"""GKD: a distillation loss against the teacher's top-k logprobs (generalized JSD, TRL's).

The student samples a response; the teacher, in one prefill of it, returns at each response
position ``t`` its ``k`` likeliest next tokens ``i_1..i_k`` and their logprobs (of the
teacher's full-vocabulary softmax at the policy's temperature). Both distributions are then
restricted to those ``k`` ids and renormalised over them:

    T_t(i) = softmax_j(teacher_logprob_t(i_j))_i        the teacher's top-k, renormalised
    S_t(i) = softmax_j(student_logit_t(i_j) / temp)_i   the student's mass on the same ids

and the per-token loss is the generalized Jensen-Shannon divergence of GKD (Agarwal et al.,
"On-Policy Distillation of Language Models", eq. 1; TRL's ``GKDTrainer.generalized_jsd_loss``)
with ``M = beta * T + (1 - beta) * S``:

    beta = 0         KL(T || S)                                   forward KL
    0 < beta < 1     beta * KL(T || M) + (1 - beta) * KL(S || M)  generalized JSD
    beta = 1         KL(S || T)                                   reverse KL

(the two ends are special-cased, as TRL does: the mixture form goes to 0 at either end). The
support is the teacher's top-k for every ``beta``: the mass either model puts outside it is
dropped before renormalising, so the loss is 0 exactly when the student's ratios among the
teacher's ``k`` likeliest tokens equal the teacher's. Gradients flow to the student's logits
only. Tensors: ``[B, T, K]`` for the top-k (a ``-inf`` teacher logprob marks a padding slot,
when rows of one batch have different ``k``), ``[B, T]`` for the mask; masked positions give
exactly 0.
"""

from __future__ import annotations

import torch

from forge.losses.normalize import masked_values

__all__ = ["generalized_jsd", "topk_forward_kl", "topk_reverse_kl"]

_FILL = -1.0e9  # an invalid slot's logit: no mass, and finite where a gradient passes


def _check(student_btk: torch.Tensor, teacher_btk: torch.Tensor, mask_bt: torch.Tensor) -> None:
    if student_btk.shape != teacher_btk.shape:
        raise ValueError(
            f"student top-k logits {tuple(student_btk.shape)} and teacher top-k logprobs "
            f"{tuple(teacher_btk.shape)} must have the same [B, T, K] shape"
        )
    if student_btk.shape[:-1] != mask_bt.shape:
        raise ValueError(
            f"top-k tensors {tuple(student_btk.shape)} do not match mask_bt {tuple(mask_bt.shape)}"
        )


def _renormalised(student_btk, teacher_btk, mask_bt):
    """Both top-k distributions as log-probs over the valid slots (a teacher logprob that is
    finite, at a counted position), and the slots' validity. Invalid slots hold a large
    finite negative value in both (exactly 0 mass, no ``inf - inf`` in a gradient), so a
    position with none is two equal uniform distributions, disconnected from the student."""
    _check(student_btk, teacher_btk, mask_bt)
    valid_btk = torch.isfinite(teacher_btk) & (mask_bt != 0).unsqueeze(-1)
    fill = torch.full(student_btk.shape, _FILL, dtype=torch.float32, device=student_btk.device)
    t = torch.where(valid_btk, teacher_btk.detach().float(), fill)
    s = torch.where(valid_btk, student_btk.float(), fill)
    return torch.log_softmax(s, -1), torch.log_softmax(t, -1), valid_btk


def _kl(log_p_btk, log_q_btk, valid_btk) -> torch.Tensor:
    """``KL(p || q)`` summed over the valid slots, ``[B, T]``."""
    term = log_p_btk.exp() * (log_p_btk - log_q_btk)
    return torch.where(valid_btk, term, torch.zeros_like(term)).sum(-1)


def generalized_jsd(
    student_logits_btk: torch.Tensor,
    teacher_logprobs_btk: torch.Tensor,
    mask_bt: torch.Tensor,
    beta: float | torch.Tensor,
) -> torch.Tensor:
    """The per-token divergence ``[B, T]`` of the module (0 at masked positions).

    ``student_logits_btk``: the student's logits (already divided by the temperature) at the
    teacher's top-k ids, with grad; ``teacher_logprobs_btk``: the teacher's logprobs of them
    (detached here); ``beta``: a float in ``[0, 1]`` or a ``[B]`` tensor (one per row, e.g.
    rows scored by teachers with different settings)."""
    beta_b = torch.as_tensor(beta, dtype=torch.float32, device=student_logits_btk.device)
    if beta_b.dim() == 0:
        beta_b = beta_b.expand(student_logits_btk.shape[0])
    if beta_b.shape != student_logits_btk.shape[:1]:
        raise ValueError(f"beta must be a float or one per row, got shape {tuple(beta_b.shape)}")
    if bool(((beta_b < 0) | (beta_b > 1)).any()):
        raise ValueError(f"beta must be in [0, 1], got {beta_b.tolist()}")
    log_s, log_t, valid = _renormalised(student_logits_btk, teacher_logprobs_btk, mask_bt)
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


def topk_forward_kl(student_logits_btk, teacher_logprobs_btk, mask_bt) -> torch.Tensor:
    """``KL(T || S)`` per token over the teacher's renormalised top-k (``beta = 0``)."""
    log_s, log_t, valid = _renormalised(student_logits_btk, teacher_logprobs_btk, mask_bt)
    return masked_values(_kl(log_t, log_s, valid), mask_bt)


def topk_reverse_kl(student_logits_btk, teacher_logprobs_btk, mask_bt) -> torch.Tensor:
    """``KL(S || T)`` per token over the teacher's renormalised top-k (``beta = 1``)."""
    log_s, log_t, valid = _renormalised(student_logits_btk, teacher_logprobs_btk, mask_bt)
    return masked_values(_kl(log_s, log_t, valid), mask_bt)
