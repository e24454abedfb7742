"""The trainer's GKD term: the loss against a teacher's top-k logprobs.

When a ``TrainBatch`` carries ``teacher_topk`` (``forge.types.TopKTargets``: episodes scored
by a teacher with ``signal: gkd``), ``TrainerCore`` adds, per micro-batch,

    coef_b * generalized_jsd(student logprobs of the top-k ids, teacher top-k logprobs)

(``forge.losses.gkd``), reduced over the counted tokens by the loss's own aggregation, to
the policy-gradient loss. The student's logprobs of the top-k ids (a log-softmax over the
vocabulary at the trainer's temperature) come from the policy-gradient term's own forward
(``forge.models.logprobs.token_and_topk_logprobs``): one pass of the model per micro-batch,
its head in checkpointed pieces where the model splits.
"""

from __future__ import annotations

import torch

from forge.losses.gkd import generalized_jsd
from forge.losses.normalize import aggregate
from forge.models.logprobs import token_and_topk_logprobs
from forge.types import TopKTargets, TrainBatch

__all__ = ["gkd_term", "rows_topk_logprobs", "student_topk_logprobs"]


def student_topk_logprobs(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    ids_btk: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``[B, T, K]`` fp32: at position ``t``, the logprobs (``log_softmax(logits /
    temperature)``) of the prediction of token ``t`` (made at ``t - 1``) of the ids
    ``ids_btk[:, t]``; position 0 holds 0. Aligned like every logprob tensor of a
    ``TrainBatch``."""
    return token_and_topk_logprobs(model, input_ids_bt, attention_mask_bt, ids_btk, temperature)[1]


def rows_topk_logprobs(
    model,
    b: TrainBatch,
    rows: torch.Tensor,
    ids_btk: torch.Tensor,
    temperature: float,
    chunked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of ``b``: their logprobs ``[R, T]`` and their logprobs of ``ids_btk``
    (``[R, T, K]``, the rows' targets) from one forward over the rows' own width (right
    padding past their longest is dropped, then restored as zeros)."""
    width = b.attention_mask_bt.shape[1]
    used = max(1, int(b.attention_mask_bt[rows].sum(-1).max()))
    lp_bt, topk_btk = token_and_topk_logprobs(
        model,
        b.input_ids_bt[rows, :used],
        b.attention_mask_bt[rows, :used],
        ids_btk[:, :used],
        temperature,
        chunked=chunked,
    )
    pad = width - used
    pad_fn = torch.nn.functional.pad
    return pad_fn(lp_bt, (0, pad)), pad_fn(topk_btk, (0, 0, 0, pad))


def gkd_term(
    student_btk: torch.Tensor,
    mask_bt: torch.Tensor,
    targets: TopKTargets,
    aggregation: str,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, metrics)`` of these rows' GKD term (see the module) from the student's
    logprobs of the targets' ids (``student_topk_logprobs``, with grad): the loss, and
    ``gkd_loss`` (the coefficient-weighted term) and ``gkd_divergence`` (the unweighted
    per-token divergence, reduced alike). Rows without targets (``coef`` 0) add 0."""
    div_bt = generalized_jsd(student_btk, targets.logprobs_btk, mask_bt, targets.beta_b)
    weighted_bt = targets.coef_b.unsqueeze(-1) * div_bt
    loss = aggregate(weighted_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        divergence = aggregate(div_bt, mask_bt, aggregation, max_tokens)
    return loss, {"gkd_loss": float(loss.detach()), "gkd_divergence": float(divergence)}
