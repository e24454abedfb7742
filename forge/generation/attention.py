"""A decode-friendly SDPA attention for grouped-query models, registered with transformers.

Transformers' ``sdpa`` attention copies every cached key and value ``num_key_value_groups``
times per layer and step (``repeat_kv``) whenever there is a padding mask, which a batch of
left-padded rows always has: on CPU that copy costs as much as the attention itself. For a
decode step (one query per row) the copy is unnecessary: the ``groups`` query heads that share
a KV head can be folded into the query-length axis, ``[B, H, 1, D] -> [B, H_kv, groups, D]``,
and attend to the un-repeated ``[B, H_kv, T, D]`` keys in one ordinary SDPA call (the padding
mask ``[B, 1, 1, T]`` broadcasts over both). Every other call (prefill, models without GQA,
sliding windows, attention biases) goes to transformers' own ``sdpa_attention_forward``.

``use_fast_decode(model)`` switches a model that uses ``sdpa`` to it; the engine calls it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "forge_sdpa"
_PLAIN_KWARGS = {"position_ids", "cache_position", "output_attentions", "use_cache"}


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
    groups = getattr(module, "num_key_value_groups", 1)
    b, h, q, d = query.shape
    plain = dropout == 0.0 and all(k in _PLAIN_KWARGS or v is None for k, v in kwargs.items())
    if q != 1 or groups == 1 or not plain or key.shape[-1] != d:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    folded = query.reshape(b, h // groups, groups, d)  # head i uses KV head i // groups
    out = F.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(b, 1, h, value.shape[-1]), None


AttentionInterface.register(NAME, forge_sdpa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_fast_decode(model) -> bool:
    """Switch ``model`` from ``sdpa`` to ``forge_sdpa``; return whether it now uses it."""
    config = model.config
    if config._attn_implementation == NAME:
        return True
    if config._attn_implementation != "sdpa":
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError):  # a model that does not dispatch through the interface
        return False
    return model.config._attn_implementation == NAME
