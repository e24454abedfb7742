"""Batch surgery on a left-padded ``transformers.DynamicCache``.

Continuous batching needs three operations between decode steps: drop finished rows, drop
leading columns that are padding for every remaining row, and append newly prefilled rows whose
cache is shorter or longer than the running one (the shorter side is left-padded with zeros,
which the attention mask hides). Each cache layer holds keys/values of shape ``[B, H, T, D]``.
Prefix reuse (``prefix_cache.py``) adds two more: copy one row's tokens out of a batch cache,
and stack such copies back into a left-padded batch cache to prefill on top of.
Only full-attention layers (``DynamicLayer``) are supported; sliding-window caches keep extra
state that this padding would corrupt. The engine's caches are full-attention in every layer,
also for models with sliding-window layers: those keep every position, and the masks the model
builds hide the positions outside its window (``attention.has_sliding_window``).

The engine's caches are made of ``GrowingLayer``s: a ``DynamicLayer`` whose keys and values are
views into a buffer with spare positions, so a decode step writes one column in place instead
of re-allocating the whole cache with ``torch.cat`` (which copies the cache every step: O(T^2)
per sequence), and dropping leading columns only moves the view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over a buffer ``[B, H, capacity, D]`` with spare positions.

    ``keys``/``values`` are the views ``[:, :, start:end]``; ``update`` writes new positions in
    place and doubles the capacity when it runs out (amortised O(1) copies per position).
    Anything that reassigns ``keys``/``values`` (transformers' own ``crop``, ``reorder``...) is
    adopted on the next ``update``.
    """

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
        super().__init__()
        self._buf_k = self._buf_v = None
        self._start = self._end = 0
        if keys is not None:
            self.lazy_initialization(keys, values)
            self._adopt(keys, values, spare=_spare(keys.shape[2]))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buf_k = None  # the first update adopts its states into a fresh buffer

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        b, h, t, d = keys.shape
        self._buf_k = keys.new_empty((b, h, t + spare, d))
        self._buf_v = values.new_empty((b, values.shape[1], t + spare, values.shape[3]))
        self._buf_k[:, :, :t] = keys
        self._buf_v[:, :, :t] = values
        self._set_view(0, t)

    def _set_view(self, start: int, end: int) -> None:
        self._start, self._end = start, end
        self.keys = self._buf_k[:, :, start:end]
        self.values = self._buf_v[:, :, start:end]
        self._view_k = self.keys

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``key_states``/``value_states`` (``[B, H, q, D]``); return the full views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[2]
        if self._buf_k is None or self.keys is not self._view_k:  # first use, or reassigned
            if self._buf_k is None and self.keys.numel() == 0:
                self._adopt(key_states, value_states, spare=_spare(q))
                return self.keys, self.values
            self._adopt(self.keys, self.values, spare=_spare(self.keys.shape[2] + q))
        if self._end + q > self._buf_k.shape[2]:
            t = self._end - self._start
            self._adopt(self.keys, self.values, spare=_spare(t + q))
        self._buf_k[:, :, self._end : self._end + q] = key_states
        self._buf_v[:, :, self._end : self._end + q] = value_states
        self._set_view(self._start, self._end + q)
        return self.keys, self.values

    def select_rows(self, rows_b: torch.Tensor) -> GrowingLayer:
        """A new layer with batch rows ``rows_b``, keeping this one's spare positions."""
        return self._sibling(
            self._buf_k.index_select(0, rows_b), self._buf_v.index_select(0, rows_b), self._start
        )

    def drop_leading(self, n: int) -> GrowingLayer:
        """A layer viewing the same buffer without its first ``n`` positions (no copy)."""
        return self._sibling(self._buf_k, self._buf_v, self._start + n)

    def _sibling(self, buf_k: torch.Tensor, buf_v: torch.Tensor, start: int) -> GrowingLayer:
        """A layer over ``buf_k``/``buf_v`` viewing positions ``start`` to this one's end."""
        out = GrowingLayer()
        out.lazy_initialization(self.keys, self.values)
        out._buf_k, out._buf_v = buf_k, buf_v
        out._set_view(start, self._end)
        return out


def _spare(t: int) -> int:
    """Spare positions for a cache holding ``t``: as many again, at least 32."""
    return max(32, t)


def growing_cache(layers_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DynamicCache:
    """A ``DynamicCache`` of ``GrowingLayer``s, empty or holding ``layers_kv``."""
    if layers_kv is None:
        cache = DynamicCache()
        cache.layer_class_to_replicate = GrowingLayer
        return cache
    cache = DynamicCache()
    cache.layer_class_to_replicate = None
    cache.layers = [GrowingLayer(k, v) for k, v in layers_kv]
    return cache


def _own_layer(layer) -> GrowingLayer | None:
    """``layer`` if it is a ``GrowingLayer`` in a consistent state (its views untouched)."""
    if type(layer) is GrowingLayer and layer._buf_k is not None and layer.keys is layer._view_k:
        return layer
    return None


def _layers_kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, GrowingLayer):
            raise NotImplementedError(
                f"continuous batching supports full-attention caches only, got "
                f"{type(layer).__name__}; use one batch per generate() call for this model"
            )
    return [(layer.keys, layer.values) for layer in cache.layers]


def is_full_attention(cache: DynamicCache) -> bool:
    """Whether every layer is a full-attention ``DynamicLayer`` (what surgery needs)."""
    return all(type(layer) in (DynamicLayer, GrowingLayer) for layer in cache.layers)


def _each_layer(cache: DynamicCache, own_op, kv_op) -> DynamicCache:
    """A new cache: ``own_op(layer)`` for every ``GrowingLayer`` (views into its buffer), or,
    when some layer is a plain ``DynamicLayer``, a copy of ``kv_op(keys, values)`` per layer."""
    kv = _layers_kv(cache)
    own = [_own_layer(layer) for layer in cache.layers]
    if all(layer is not None for layer in own):
        out = growing_cache([])
        out.layers = [own_op(layer) for layer in own]
        return out
    return growing_cache([kv_op(k, v) for k, v in kv])


def select_rows(cache: DynamicCache, rows_b: torch.Tensor) -> DynamicCache:
    """Keep only batch rows ``rows_b`` (an index tensor), in that order."""
    return _each_layer(
        cache, lambda layer: layer.select_rows(rows_b), lambda k, v: (k[rows_b], v[rows_b])
    )


def drop_leading_columns(cache: DynamicCache, n: int) -> DynamicCache:
    """Drop the first ``n`` sequence positions (padding for every row)."""
    if n == 0:
        return cache
    return _each_layer(
        cache, lambda layer: layer.drop_leading(n), lambda k, v: (k[:, :, n:], v[:, :, n:])
    )


def concat_left_padded(a: DynamicCache, b: DynamicCache) -> DynamicCache:
    """Stack the rows of ``a`` then ``b``, left-padding the shorter one with zeros."""
    kv_a, kv_b = _layers_kv(a), _layers_kv(b)
    t_a, t_b = kv_a[0][0].shape[2], kv_b[0][0].shape[2]
    t = max(t_a, t_b)

    def pad(x: torch.Tensor, cur: int) -> torch.Tensor:
        return F.pad(x, (0, 0, t - cur, 0))  # (D left, D right, T left, T right)

    return growing_cache(
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
    return growing_cache(layers)
