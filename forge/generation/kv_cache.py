"""Batch surgery on a left-padded ``transformers.DynamicCache``.

Continuous batching needs three operations between decode steps: drop finished rows, drop
leading columns that are padding for every remaining row, and append newly prefilled rows whose
cache is shorter or longer than the running one (the shorter side is left-padded with zeros,
which the attention mask hides). Each cache layer holds keys/values of shape ``[B, H, T, D]``.
Prefix reuse (``prefix_cache.py``) adds two more: copy one row's tokens out of a batch cache,
and stack such copies back into a left-padded batch cache to prefill on top of.
Only full-attention layers (``DynamicLayer``) are supported; sliding-window caches keep extra
state that this padding would corrupt.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _layers_kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"continuous batching supports full-attention caches only, got "
                f"{type(layer).__name__}; use one batch per generate() call for this model"
            )
    return [(layer.keys, layer.values) for layer in cache.layers]


def is_full_attention(cache: DynamicCache) -> bool:
    """Whether every layer is a plain full-attention ``DynamicLayer`` (what surgery needs)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def select_rows(cache: DynamicCache, rows_b: torch.Tensor) -> DynamicCache:
    """Keep only batch rows ``rows_b`` (an index tensor), in that order."""
    return DynamicCache([(k[rows_b], v[rows_b]) for k, v in _layers_kv(cache)])


def drop_leading_columns(cache: DynamicCache, n: int) -> DynamicCache:
    """Drop the first ``n`` sequence positions (padding for every row)."""
    if n == 0:
        return cache
    return DynamicCache([(k[:, :, n:], v[:, :, n:]) for k, v in _layers_kv(cache)])


def concat_left_padded(a: DynamicCache, b: DynamicCache) -> DynamicCache:
    """Stack the rows of ``a`` then ``b``, left-padding the shorter one with zeros."""
    kv_a, kv_b = _layers_kv(a), _layers_kv(b)
    t_a, t_b = kv_a[0][0].shape[2], kv_b[0][0].shape[2]
    t = max(t_a, t_b)

    def pad(x: torch.Tensor, cur: int) -> torch.Tensor:
        return F.pad(x, (0, 0, t - cur, 0))  # (D left, D right, T left, T right)

    return DynamicCache(
        [
            (torch.cat([pad(ka, t_a), pad(kb, t_b)]), torch.cat([pad(va, t_a), pad(vb, t_b)]))
            for (ka, va), (kb, vb) in zip(kv_a, kv_b)
        ]
    )


def row_kv(cache: DynamicCache, row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of row ``row``'s last ``length`` positions (its tokens: padding is on the left),
    per layer ``(keys, values)`` of shape ``[H, length, D]``."""
    return [
        (k[row, :, -length:].clone(), v[row, :, -length:].clone()) for k, v in _layers_kv(cache)
    ]


def stack_left_padded(
    rows_kv: list[list[tuple[torch.Tensor, torch.Tensor]] | None], lengths: list[int]
) -> DynamicCache:
    """A batch cache whose row i holds the first ``lengths[i]`` positions of ``rows_kv[i]``
    (per layer ``[H, T_i, D]``; ``None`` when ``lengths[i] == 0``), left-padded with zeros to
    ``max(lengths)`` positions."""
    width = max(lengths)
    first = next(kv for kv, n in zip(rows_kv, lengths) if n > 0)
    layers = []
    for layer, (k0, v0) in enumerate(first):
        h, _, d = k0.shape
        keys = k0.new_zeros((len(lengths), h, width, d))
        values = v0.new_zeros((len(lengths), v0.shape[0], width, v0.shape[2]))
        for i, (kv, n) in enumerate(zip(rows_kv, lengths)):
            if n > 0:
                keys[i, :, width - n :] = kv[layer][0][:, :n]
                values[i, :, width - n :] = kv[layer][1][:, :n]
        layers.append((keys, values))
    return DynamicCache(layers)
