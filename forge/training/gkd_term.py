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
from forge.types import TopKTargets

__all__ = ["gkd_term", "student_topk_logprobs"]


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
