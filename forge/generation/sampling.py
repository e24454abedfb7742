"""Per-row next-token sampling: temperature, top-k, top-p, greedy, counter-based per-row RNG.

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


# Tokens per block of the two-level inverse CDF (``inverse_cdf``).
CDF_BLOCK = 256


def inverse_cdf(probs_bv: torch.Tensor, uniforms_b: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability (float64) exceeds ``u * total``:
    zero-probability tokens (a flat CDF) never win; the result is clamped to the vocabulary.

    Two levels instead of a float64 cumsum over the whole vocabulary, a visible share of a
    bf16 decode step at a large vocabulary (docs/performance.md): block sums, their cumsum,
    a search for the block, then a cumsum inside that one block only. The CDF's
    values differ from a flat cumsum's only in float64 rounding (~1e-16).
    """
    b, v = probs_bv.shape
    nb = -(-v // CDF_BLOCK)
    padded_bv = probs_bv
    if nb * CDF_BLOCK != v:  # zero-probability padding: never drawn
        padded_bv = torch.nn.functional.pad(probs_bv, (0, nb * CDF_BLOCK - v))
    blocks_bnk = padded_bv.view(b, nb, CDF_BLOCK)
    block_cdf_bn = blocks_bnk.sum(-1, dtype=torch.float64).cumsum(-1)
    target_b1 = uniforms_b.unsqueeze(1) * block_cdf_bn[:, -1:]
    block_b = torch.searchsorted(block_cdf_bn, target_b1, right=True).squeeze(1).clamp_(max=nb - 1)
    rows_b = torch.arange(b, device=probs_bv.device)
    before_b = torch.where(block_b > 0, block_cdf_bn[rows_b, (block_b - 1).clamp(min=0)], 0.0)
    local_bk = blocks_bnk[rows_b, block_b].cumsum(-1, dtype=torch.float64) + before_b[:, None]
    inner_b = torch.searchsorted(local_bk, target_b1, right=True).squeeze(1)
    return (block_b * CDF_BLOCK + inner_b.clamp_(max=CDF_BLOCK - 1)).clamp_(max=v - 1)


_MASK64 = (1 << 64) - 1


def counter_uniform(seed: int, counter: int) -> float:
    """A uniform in ``[0, 1)`` from ``(seed, counter)``: the splitmix64 hash, top 53 bits.

    Counter-based randomness: a row's ``i``-th draw depends only on its seed and ``i``, not on
    how many draws came before or which rows share the batch, so it needs no generator state
    and a whole batch samples with one ``searchsorted``.
    """
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


def sample_next(
    logits_bv: torch.Tensor,
    params: Sequence[SamplingParams],
    uniforms_b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(token_ids_b, logprobs_b)``.

    Row i uses ``params[i]`` and turns the uniform ``uniforms_b[i]`` (in ``[0, 1)``; ``None``:
    drawn from the global RNG) into a token by inverting its filtered distribution's CDF, so
    a row given the same uniform samples the same token whatever else shares the batch (the
    engine derives it from the row's seed and position with ``counter_uniform``).
    """
    b, v = logits_bv.shape
    if len(params) != b or (uniforms_b is not None and uniforms_b.shape != (b,)):
        raise ValueError(
            f"sample_next got {b} rows of logits, {len(params)} params and "
            f"{None if uniforms_b is None else tuple(uniforms_b.shape)} uniforms; "
            "pass one of each per row"
        )
    device = logits_bv.device
    temps = [effective_temperature(p.temperature) for p in params]
    scaled_bv = logits_bv.float()
    if any(t != 1.0 for t in temps):
        scaled_bv = scaled_bv / torch.tensor(temps, device=device).unsqueeze(1)
    logprobs_bv = torch.log_softmax(scaled_bv, dim=-1)
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k_b = torch.tensor([p.top_k for p in params], device=device, dtype=torch.long)
        top_p_b = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        keep_bv = top_k_top_p_mask(scaled_bv, top_k_b, top_p_b)
        probs_bv = torch.softmax(scaled_bv.masked_fill(~keep_bv, float("-inf")), dim=-1)
    else:
        probs_bv = logprobs_bv.exp()
    if uniforms_b is None:
        uniforms_b = torch.rand(b, dtype=torch.float64)
    token_ids_b = inverse_cdf(probs_bv, uniforms_b.to(device=device, dtype=torch.float64))
    drawn_zero_b = probs_bv.gather(1, token_ids_b.unsqueeze(1)).squeeze(1) == 0
    if bool(drawn_zero_b.any()):  # u * total rounded up to the total: take the likeliest token
        token_ids_b = torch.where(drawn_zero_b, probs_bv.argmax(dim=-1), token_ids_b)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    if greedy:
        greedy_b = torch.tensor(greedy, device=device)
        token_ids_b[greedy_b] = scaled_bv[greedy_b].argmax(dim=-1)
    return token_ids_b, logprobs_bv.gather(1, token_ids_b.unsqueeze(1)).squeeze(1)
