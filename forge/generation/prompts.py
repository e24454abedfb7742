"""What every generator backend does to a request before generating: the prompt encoding
rule and the sampling parameters of a call.

- :data:`Prompt`: plain text, chat messages (rendered with the chat template), or token ids
  (used verbatim: multi-turn rollouts send the whole conversation as the ids they built).
- :func:`encode_prompt`: ``(text, ids)`` of a prompt, the one rule every backend follows.
- :func:`make_sampling_params`: a config's default ``SamplingParams`` with a call's keyword
  overrides, checked by name and type.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from forge.types import SamplingParams

__all__ = ["Prompt", "encode_prompt", "make_sampling_params"]

Prompt = str | list[dict[str, Any]] | list[int]


def encode_prompt(
    tokenizer, prompt: Prompt, max_positions: int | None = None
) -> tuple[str, list[int]]:
    """``(text, ids)`` of a prompt, the one encoding rule every generator backend uses.

    - ``str``: tokenised with the tokenizer's special tokens (e.g. a BOS).
    - chat messages (a list of dicts): the chat template with ``add_generation_prompt=True``,
      tokenised without adding special tokens (the template already holds any BOS).
    - token ids (a non-empty list of ints): used verbatim, nothing added; ``text`` is
      ``tokenizer.decode(ids)``, for the record only.

    Chat messages for a tokenizer without a chat template (a base model) are a ``ValueError``
    that names the fix. ``max_positions`` (the model's context length): a prompt of that many
    tokens or more is a ``ValueError``, since no token could be generated after it. ``TypeError`` for any other
    prompt type, ``ValueError`` for a prompt that encodes to zero tokens.
    """
    if isinstance(prompt, str):
        text = prompt
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"chat messages given to a model without a chat template "
                f"({getattr(tokenizer, 'name_or_path', '?')}: a base model): give it plain-text "
                "prompts (strings), e.g. 'Question: ...\nAnswer:', with a stop string such as "
                "generator.sampling.stop: ['\\n']; or use the model's instruct version"
            )
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    elif isinstance(prompt, list) and prompt:
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or t < 0]
        if bad:
            raise TypeError(
                f"a token-id prompt must hold only ints >= 0, got {type(bad[0]).__name__} "
                f"{bad[0]!r}; pass a string, chat messages (dicts) or a list of token ids"
            )
        ids = list(prompt)
        text = tokenizer.decode(ids)
    elif isinstance(prompt, list):
        raise ValueError("prompt is an empty list; pass chat messages or token ids")
    else:
        raise TypeError(
            "prompt must be a string or a list of chat messages (dicts) or of token ids "
            f"(ints), got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError("prompt encodes to zero tokens; pass a non-empty prompt")
    if max_positions is not None and len(ids) >= max_positions:
        raise ValueError(
            f"prompt has {len(ids)} tokens but the model's max_position_embeddings "
            f"is {max_positions}; shorten the prompt"
        )
    return text, ids


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "n": (int,),
    "max_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "stop": (str, list, tuple),
    "seed": (int, type(None)),
    "logprobs": (bool,),
    "ignore_eos": (bool,),
}


def make_sampling_params(defaults: SamplingParams, overrides: dict[str, Any]) -> SamplingParams:
    """``defaults`` with ``overrides`` applied and validated.

    Raises ``TypeError`` naming unknown keys (and listing the valid ones) or a value of the
    wrong type; ``ValueError`` (from ``SamplingParams``) for an out-of-range value.
    """
    unknown = sorted(set(overrides) - set(_FIELD_TYPES))
    if unknown:
        raise TypeError(
            f"unknown sampling parameter(s) {unknown}; valid ones are {list(_FIELD_TYPES)}"
        )
    for key, value in overrides.items():
        bad_bool = (
            isinstance(value, bool) and bool not in _FIELD_TYPES[key]
        )  # bool is an int subclass
        if bad_bool or not isinstance(value, _FIELD_TYPES[key]):
            raise TypeError(
                f"sampling parameter {key}={value!r} has type {type(value).__name__}; "
                f"expected {' or '.join(t.__name__ for t in _FIELD_TYPES[key])}"
            )
    if "stop" in overrides and not isinstance(overrides["stop"], str):
        overrides = {**overrides, "stop": list(overrides["stop"])}
    params = dataclasses.replace(defaults, **overrides)
    params.stop = list(params.stop)  # never share the defaults' list
    return params
