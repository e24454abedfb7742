"""A learned reward model: a sequence classifier with one output scoring (prompt, response).

``RewardModelCore(cfg).score(pairs)`` loads an ``AutoModelForSequenceClassification`` with
``num_labels=1`` (the usual layout of open reward models, e.g. Skywork-Reward or
``trl``'s ``RewardTrainer`` output) and returns one float per pair::

    core = RewardModelCore(RewardModelConfig(model="/tmp/rm"))
    core.score([("What is 2+2? ", "4"), ("What is 2+2? ", "5")])   # -> [0.81, -1.3]

How a pair is scored: the text ``prompt + response`` is tokenized (apply any chat template to
the prompt before calling: the model sees exactly that text), right-padded into micro-batches
of ``micro_batch_size`` rows, and the model's output at each row's last token is the score.
HF's sequence classifiers find that token as the rightmost one that is not the pad id, so
the model's ``pad_token_id`` is set to the tokenizer's (eos when the tokenizer has no pad
token). Sequences longer than ``max_length`` tokens lose their *start* (left truncation):
the score is read at the end of the response, which must survive.

``make_tiny_reward_model(path)`` builds a small randomly initialised reward model of the
tiny Qwen2 family (``forge.models.tiny``) for tests and demos; the ``RewardModel`` actor
(``forge.actors.reward_model``) serves it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from forge.models.loading import (
    DTYPES,
    _missing_model_error,
    load_tokenizer,
    local_source,
    resolve_dtype,
)
from forge.models.tiny import make_tiny_model

__all__ = ["RewardModelConfig", "RewardModelCore", "make_tiny_reward_model"]

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class RewardModelConfig:
    """A sequence-classification reward model and how to run it."""

    model: str
    """HF model directory (or hub id) of an ``AutoModelForSequenceClassification`` with
    ``num_labels=1``."""
    dtype: str = "float32"
    """The model's dtype."""
    device: str = "auto"
    """``auto`` picks ``cuda`` when a GPU is visible, else ``cpu``."""
    attn_implementation: str = "eager"
    """The transformers attention implementation."""
    max_length: int = 1024
    """Tokens per ``prompt + response`` (at most the model's ``max_position_embeddings``);
    longer texts lose their start."""
    micro_batch_size: int = 8
    """Rows per forward pass."""
    name: str = "reward_model"
    """The component name its score is reported under in ``RewardResult.components``."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"RewardModelConfig.model must be a model directory or hub id, got {self.model!r}"
            )
        for key, value, choices in (
            ("dtype", self.dtype, DTYPES),
            ("device", self.device, DEVICES),
        ):
            if value not in choices:
                raise ValueError(
                    f"RewardModelConfig.{key}: unknown value {value!r}; choose one of {choices}"
                )
        for key in ("max_length", "micro_batch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RewardModelConfig.{key} must be an int >= 1, got {value!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"RewardModelConfig.name must be a non-empty string (the reward component's "
                f"name), got {self.name!r}"
            )


def _check_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise TypeError(
            f"score takes a list of (prompt, response) string pairs, got {type(pairs).__name__}"
        )
    out = []
    for i, pair in enumerate(pairs):
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(s, str) for s in pair)
        ):
            raise TypeError(
                f"score: pair {i} is {pair!r}; each item must be a (prompt, response) tuple of "
                "two strings"
            )
        if not pair[0] and not pair[1]:
            raise ValueError(f"score: pair {i} has an empty prompt and response; nothing to score")
        out.append((pair[0], pair[1]))
    return out


class RewardModelCore:
    """A reward model in eval mode that only ever scores pairs. See the module docstring."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        from transformers import AutoModelForSequenceClassification

        self.cfg = cfg
        self.device = cfg.device
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        source = local_source(cfg.model)
        self.tokenizer = load_tokenizer(source)  # pad falls back to eos
        # Right padding keeps positions 0..n-1 for every row (no position ids needed), and
        # left truncation keeps the end of the response, where the score is read.
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                source,
                dtype=resolve_dtype(cfg.dtype),
                attn_implementation=cfg.attn_implementation,
            )
        except OSError as e:
            raise _missing_model_error(source) from e
        if model.config.num_labels != 1:
            raise ValueError(
                f"{cfg.model} is a classifier with num_labels={model.config.num_labels}; a "
                "reward model has num_labels=1 (one scalar score)"
            )
        # The classifier reads each row at its rightmost non-pad token: pads must match ours.
        model.config.pad_token_id = self.tokenizer.pad_token_id
        limit = getattr(model.config, "max_position_embeddings", None)
        self.max_length = min(cfg.max_length, limit) if limit else cfg.max_length
        self.model = model.to(self.device).eval().requires_grad_(False)

    @torch.no_grad()
    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """One float per ``(prompt, response)`` pair, in order."""
        pairs = _check_pairs(pairs)
        scores: list[float] = []
        per = self.cfg.micro_batch_size
        for start in range(0, len(pairs), per):
            texts = [p + r for p, r in pairs[start : start + per]]
            enc = self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            logits_b1 = self.model(
                input_ids=enc["input_ids"].to(self.device),
                attention_mask=enc["attention_mask"].to(self.device),
            ).logits
            scores.extend(logits_b1[:, 0].float().cpu().tolist())
        return scores


def make_tiny_reward_model(out_dir: str | os.PathLike, seed: int = 0, preset: str = "mini") -> Path:
    """Write a randomly initialised reward model (a sequence classifier with one output) of
    the tiny Qwen2 family, with the tiny models' tokenizer, to ``out_dir`` and return it.

    ``preset`` is one of ``forge.models.PRESETS``; the same ``seed`` gives bit-identical
    weights, and the global torch RNG is left untouched. Its scores are arbitrary (it is
    untrained) but deterministic, which is what tests of the plumbing need.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    out = make_tiny_model(out_dir, preset=preset, seed=seed)  # config + tokenizer to reuse
    config = AutoConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    config.tie_word_embeddings = False  # no LM head to tie
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    for stale in ("model.safetensors", "generation_config.json"):  # the causal LM's
        (out / stale).unlink(missing_ok=True)
    model.save_pretrained(out)
    return out
