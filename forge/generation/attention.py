"""A decode-friendly SDPA attention for grouped-query models, registered with transformers.

Transformers' ``sdpa`` attention copies every cached key and value ``num_key_value_groups``
times per layer and step (``repeat_kv``) whenever there is a padding mask, which a batch of
left-padded rows always has: on CPU that copy costs as much as the attention itself. For a
decode step (one query per row) the copy is unnecessary: the ``groups`` query heads that share
a KV head can be folded into the query-length axis, ``[B, H, 1, D] -> [B, H_kv, groups, D]``,
and attend to the un-repeated ``[B, H_kv, T, D]`` keys in one ordinary SDPA call (the padding
mask ``[B, 1, 1, T]`` broadcasts over both). Every other call (prefill, models without GQA,
sliding windows, attention biases) goes to transformers' own ``sdpa_attention_forward``.

The same fold exists for ``eager`` attention (``forge_eager``: the model's own eager function
for everything else, and the same matmul + additive mask + fp32 softmax on decode steps).
``use_fast_decode(model)`` switches a model from ``sdpa``/``eager`` to its twin; the engine
calls it.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

SDPA, EAGER = "forge_sdpa", "forge_eager"
CONTIGUOUS_DECODE = True  # bf16/fp16 decode: attend over a contiguous copy of the KV views
_PLAIN_KWARGS = {"position_ids", "cache_position", "output_attentions", "use_cache"}


def _foldable(module, query, key, dropout: float, kwargs: dict) -> bool:
    """A decode step of a grouped-query layer with nothing but a padding mask."""
    return (
        query.shape[2] == 1
        and getattr(module, "num_key_value_groups", 1) > 1
        and dropout == 0.0
        and key.shape[-1] == query.shape[-1]
        and all(k in _PLAIN_KWARGS or v is None for k, v in kwargs.items())
    )


def _fold(query: torch.Tensor, groups: int) -> torch.Tensor:
    b, h, _, d = query.shape
    return query.reshape(b, h // groups, groups, d)  # query head i uses KV head i // groups


def forge_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``sdpa_attention_forward`` with grouped heads folded instead of repeated on decode steps.

    Shapes as transformers passes them: ``query [B, H, q, D]``, ``key``/``value``
    ``[B, H_kv, T, D]``; returns ``([B, q, H, D], None)``.
    """
    if not _foldable(module, query, key, dropout, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    b, h = query.shape[:2]
    folded = _fold(query, module.num_key_value_groups)
    out = F.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(b, 1, h, value.shape[-1]), None


def forge_eager_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's own eager attention, with grouped heads folded on decode steps: the same
    matmul, additive mask and fp32 softmax, without the repeated KV copy."""
    if not _foldable(module, query, key, dropout, kwargs):
        return _model_eager(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    b, h = query.shape[:2]
    if CONTIGUOUS_DECODE and key.dtype != torch.float32:
        # The cache hands views into a buffer with spare positions; a bf16 matmul over such
        # a view took ~4x as long as a copy and a matmul over the copy (32 rows x 150
        # positions: 468 vs 113 + 69 us; docs/performance.md). float32 is left as it was.
        key, value = key.contiguous(), value.contiguous()
    scores = torch.matmul(_fold(query, module.num_key_value_groups), key.transpose(2, 3))
    scores = scores * scaling
    if attention_mask is not None:
        scores = scores + attention_mask  # [B, 1, 1, T] broadcasts over KV heads and groups
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value)
    return out.reshape(b, 1, h, value.shape[-1]), None


_EAGER: dict[type, object] = {}


def _model_eager(module):
    """The ``eager_attention_forward`` of the module's own modeling file."""
    fn = _EAGER.get(type(module))
    if fn is None:
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise NotImplementedError(
                f"{type(module).__name__} has no eager_attention_forward in its modeling file; "
                "load the generator's model with attn_implementation='sdpa'"
            )
        _EAGER[type(module)] = fn
    return fn


AttentionInterface.register(SDPA, forge_sdpa_attention)
AttentionMaskInterface.register(SDPA, sdpa_mask)
AttentionInterface.register(EAGER, forge_eager_attention)
AttentionMaskInterface.register(EAGER, eager_mask)
_FAST = {"sdpa": SDPA, "eager": EAGER}


def use_fast_decode(model) -> str | None:
    """Switch ``model`` from ``sdpa``/``eager`` to its folded-decode twin; return the name
    now in use (``None``: another implementation, left as it is)."""
    current = model.config._attn_implementation
    if current in _FAST.values():
        return current
    if current not in _FAST or not _has_eager(model):
        return None
    try:
        model.set_attn_implementation(_FAST[current])
    except (ValueError, ImportError):  # a model that does not dispatch through the interface
        return None
    return _FAST[current] if model.config._attn_implementation == _FAST[current] else None


def has_sliding_window(model) -> bool:
    """Whether some attention layer of ``model`` sees only a window of recent positions
    (Gemma 3's local layers, Mistral's window). Such a model keeps every position in the
    engine's cache and hides the old ones with the masks it builds itself from the 2D mask:
    positions are columns, and a row's tokens are contiguous, so the window is exact."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    if getattr(config, "sliding_window", None) is None:
        return False
    layer_types = getattr(config, "layer_types", None)
    return layer_types is None or "sliding_attention" in layer_types


def _has_eager(model) -> bool:
    """Whether the model's modeling file has the eager function the fallback calls."""
    return hasattr(sys.modules[type(model).__module__], "eager_attention_forward")


def decode_mask(mask_bt: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """A decode step's 4D mask ``[B, 1, 1, T]`` as ``implementation`` takes it (boolean for
    SDPA, additive for eager), so the model skips building one every step."""
    keep = mask_bt.bool()[:, None, None, :]
    if implementation == SDPA:
        return keep
    zeros = torch.zeros(keep.shape, dtype=dtype, device=mask_bt.device)
    return zeros.masked_fill_(~keep, torch.finfo(dtype).min)
