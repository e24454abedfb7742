"""Model building, loading and logprob computation."""

from forge.models.loading import load_model, load_tokenizer, local_source, resolve_dtype
from forge.models.logprobs import (
    gather_logprobs,
    pad_and_stack,
    pad_response_values,
    position_ids_from_mask,
    token_logprobs,
)
from forge.models.tiny import PRESETS, ensure_tiny_model, make_tiny_model

__all__ = [
    "PRESETS",
    "ensure_tiny_model",
    "gather_logprobs",
    "load_model",
    "load_tokenizer",
    "local_source",
    "make_tiny_model",
    "pad_and_stack",
    "pad_response_values",
    "position_ids_from_mask",
    "resolve_dtype",
    "token_logprobs",
]
