"""Per-row next-token sampling: temperature, top-k, top-p, greedy, per-row RNG.

Logprob convention (what RL needs): the returned logprob of a sampled token is taken from
``log_softmax(logits / temperature)`` *before* top-k/top-p filtering. That is the distribution
the trainer recomputes from a teacher-forced forward pass at the same temperature. Filtering
only decides which tokens may be drawn. Greedy rows (``temperature == 0``) report the logprob
under the unscaled distribution (temperature 1), matching ``effective_temperature``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.models.logprobs import effective_temperature
from forge.types import SamplingParams


def top_k_top_p_mask(
    logits_bv: torch.Tensor, top_k_b: torch.Tensor, top_p_b: torch.Tensor
) -> torch.Tensor:
    """Boolean ``[B, V]`` mask of tokens kept by top-k then top-p (vLLM's order).

    ``top_k_b[i] == 0`` and ``top_p_b[i] == 1`` disable the filters. Top-p keeps the smallest
    set of highest-probability tokens (among the top-k, renormalised) whose mass reaches
    ``top_p``; the most likely token is always kept. Exactly ``k`` tokens survive top-k, with
    ties broken by sort order.
    """
    b, v = logits_bv.shape
    sorted_bv, order_bv = logits_bv.sort(dim=-1, descending=True)
    rank_v = torch.arange(v, device=logits_bv.device)
    k_b = torch.where(top_k_b > 0, top_k_b, torch.full_like(top_k_b, v))
    keep_sorted_bv = rank_v.unsqueeze(0) < k_b.unsqueeze(1)
    probs_bv = torch.softmax(sorted_bv.masked_fill(~keep_sorted_bv, float("-inf")), dim=-1)
    mass_before_bv = probs_bv.cumsum(dim=-1) - probs_bv
    keep_sorted_bv &= mass_before_bv < top_p_b.unsqueeze(1)
    keep_sorted_bv[:, 0] = True
    return torch.zeros_like(keep_sorted_bv).scatter(1, order_bv, keep_sorted_bv)


def sample_next(
    logits_bv: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(token_ids_b, logprobs_b)``.

    Row i uses ``params[i]`` and draws with ``generators[i]`` (``None``: the global RNG), so a
    seeded row samples the same tokens whatever else shares the batch.
    """
    if not len(params) == len(generators) == logits_bv.shape[0]:
        raise ValueError(
            f"sample_next got {logits_bv.shape[0]} rows of logits, {len(params)} params and "
            f"{len(generators)} generators; pass one of each per row"
        )
    device = logits_bv.device
    temps_b = torch.tensor(
        [effective_temperature(p.temperature) for p in params], device=device, dtype=torch.float32
    )
    scaled_bv = logits_bv.float() / temps_b.unsqueeze(1)
    logprobs_bv = torch.log_softmax(scaled_bv, dim=-1)
    top_k_b = torch.tensor([p.top_k for p in params], device=device, dtype=torch.long)
    top_p_b = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
    keep_bv = top_k_top_p_mask(scaled_bv, top_k_b, top_p_b)
    probs_bv = torch.softmax(scaled_bv.masked_fill(~keep_bv, float("-inf")), dim=-1)

    tokens = []
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.temperature == 0:
            tokens.append(scaled_bv[i].argmax().view(1))
        else:
            tokens.append(torch.multinomial(probs_bv[i], 1, generator=g))
    token_ids_b = torch.cat(tokens)
    return token_ids_b, logprobs_bv.gather(1, token_ids_b.unsqueeze(1)).squeeze(1)
