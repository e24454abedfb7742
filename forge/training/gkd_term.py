"""The trainer's GKD term: the student's logprobs of the teacher's top-k ids, and the loss.

When a ``TrainBatch`` carries ``teacher_topk`` (``forge.types.TopKTargets``: episodes scored
by a teacher with ``signal: gkd``), ``TrainerCore`` adds, per micro-batch,

    coef_b * generalized_jsd(student logprobs of the top-k ids, teacher top-k logprobs)

(``forge.losses.gkd``), reduced over the counted tokens by the loss's own aggregation, to
the policy-gradient loss. The student's logprobs (a log-softmax over the vocabulary at the
trainer's temperature) come from a forward of the rows with grad:
one more forward than the policy-gradient term's, through the wrapped model (so DDP and
FSDP see a normal forward), holding the micro-batch's ``[rows, T, vocab]`` logits.
"""

from __future__ import annotations

import torch

from forge.losses.gkd import generalized_jsd
from forge.losses.normalize import aggregate
from forge.models.logprobs import effective_temperature, position_ids_from_mask
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
    out = model(
        input_ids=input_ids_bt,
        attention_mask=attention_mask_bt,
        position_ids=position_ids_from_mask(attention_mask_bt),
    )
    logits_btv = out.logits[:, :-1].float() / effective_temperature(temperature)
    picked_btk = torch.log_softmax(logits_btv, -1).gather(-1, ids_btk[:, 1:])
    return torch.nn.functional.pad(picked_btk, (0, 0, 1, 0))


def gkd_term(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    targets: TopKTargets,
    temperature: float,
    aggregation: str,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, metrics)`` of these rows' GKD term (see the module): the loss with grad, and
    ``gkd_loss`` (the coefficient-weighted term) and ``gkd_divergence`` (the unweighted
    per-token divergence, reduced alike). Rows without targets (``coef`` 0) add 0."""
    s_btk = student_topk_logprobs(
        model, input_ids_bt, attention_mask_bt, targets.ids_btk, temperature
    )
    div_bt = generalized_jsd(s_btk, targets.logprobs_btk, mask_bt, targets.beta_b)
    weighted_bt = targets.coef_b.unsqueeze(-1) * div_bt
    loss = aggregate(weighted_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        divergence = aggregate(div_bt, mask_bt, aggregation, max_tokens)
    return loss, {"gkd_loss": float(loss.detach()), "gkd_divergence": float(divergence)}
