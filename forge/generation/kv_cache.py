"""Batch surgery on a left-padded ``transformers.DynamicCache``.

Continuous batching needs three operations between decode steps: drop finished rows, drop
leading columns that are padding for every remaining row, and append newly prefilled rows whose
cache is shorter or longer than the running one (the shorter side is left-padded with zeros,
which the attention mask hides). Each cache layer holds keys/values of shape ``[B, H, T, D]``.
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
