"""What a model a user brings is, and whether Forge computes it correctly: ``forge models
check MODEL``.

``check_model`` loads the model as a run would (a directory, a hub id, a GGUF file or a
shipped name) and reports its family (and whether Forge verified that family, see
``VERIFIED``), parameters, vocabulary, special tokens (and whether the tokenizer adds BOS and
EOS), chat template, the precision ``auto`` picks here, a memory estimate for a batch shape, a
greedy completion of a probe prompt, and the parity of the generator's logprobs (at the
precision ``auto`` picks) against the float32 forward the trainer computes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from forge.models.loading import check_special_ids

__all__ = ["VERIFIED", "BatchShape", "check_model", "check_special_ids", "format_report"]

# model_type -> the tiny preset whose tests cover it (tests/unit/test_model_families.py).
VERIFIED = {
    "llama": "llama",
    "qwen2": "tiny",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "mistral": "mistral",
    "phi3": "phi3",
}
TEXT_PROBE = "The capital of France is"
CHAT_PROBE = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class BatchShape:
    """The rollout batch the memory estimate is for."""

    rows: int = 64
    prompt_tokens: int = 64
    new_tokens: int = 16


def _specials(tokenizer) -> dict[str, Any]:
    ids = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    out = {}
    for name in ("bos", "eos", "pad"):
        tid = getattr(tokenizer, f"{name}_token_id")
        out[name] = None if tid is None else (tid, getattr(tokenizer, f"{name}_token"))
    out["adds_bos"] = bool(ids) and ids[0] == tokenizer.bos_token_id
    out["adds_eos"] = bool(ids) and ids[-1] == tokenizer.eos_token_id
    return out


def _memory(model, shape: BatchShape, gen_bytes: int) -> dict[str, float]:
    """Estimated GiB per role for ``shape`` (weights, KV cache, logits; trainer: float32
    weights, gradients and AdamW's two moments, plus the chunked head's logits)."""
    cfg = model.config.get_text_config()
    params = sum(p.numel() for p in model.parameters())
    vocab = cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    tokens = shape.rows * (shape.prompt_tokens + shape.new_tokens)
    kv = 2 * cfg.num_hidden_layers * kv_heads * head_dim * tokens * gen_bytes
    from forge.models.logprobs import DEFAULT_CHUNK_TOKENS

    gib = 2.0**30
    return {
        "generator": (params * gen_bytes + kv + shape.rows * vocab * 4) / gib,
        "trainer": (params * 16 + 3 * min(tokens, DEFAULT_CHUNK_TOKENS) * vocab * 4) / gib,
    }


def check_model(spec: str, shape: BatchShape | None = None, tokens: int = 16) -> dict[str, Any]:
    """The report ``forge models check`` prints (see the module)."""
    import torch

    from forge.generation import HFEngine
    from forge.models.loading import load_model, load_tokenizer
    from forge.models.logprobs import token_logprobs
    from forge.models.precision import resolve_auto
    from forge.replay import collate_episodes
    from forge.training.trainer_core import mismatch_metrics
    from forge.types import Episode, SamplingParams

    shape, t0 = shape or BatchShape(), time.perf_counter()
    tokenizer = load_tokenizer(spec)
    trainer_model = load_model(spec, "float32")
    check_special_ids(trainer_model.config, tokenizer, spec)
    dtype = resolve_auto("generator.dtype", "auto", "cpu", warn=False) or "float32"
    gen_model = trainer_model if dtype == "float32" else load_model(spec, dtype)
    engine = HFEngine(gen_model, tokenizer, max_batch_size=8)
    probe = CHAT_PROBE if tokenizer.chat_template else TEXT_PROBE
    [[greedy]] = engine.generate([(probe, SamplingParams(max_tokens=tokens, temperature=0))])
    [sampled] = engine.generate([(probe, SamplingParams(n=4, max_tokens=tokens, seed=0))])
    batch = collate_episodes(
        [
            Episode(f"p{i}", c.prompt_ids, c.token_ids, c.logprobs, 0.0, 0)
            for i, c in enumerate(sampled)
        ],
        pad_id=engine.pad_id,
    )
    with torch.no_grad():
        lp_bt = token_logprobs(trainer_model, batch.input_ids_bt, batch.attention_mask_bt)
    config = trainer_model.config
    return {
        "model": spec,
        "family": config.model_type,
        "verified": config.model_type in VERIFIED,
        "architectures": list(getattr(config, "architectures", None) or []),
        "parameters": sum(p.numel() for p in trainer_model.parameters()),
        "vocab": config.get_text_config().vocab_size,
        **_specials(tokenizer),
        "chat_template": bool(tokenizer.chat_template),
        "generator_dtype": dtype,
        "memory_gib": _memory(trainer_model, shape, 2 if dtype != "float32" else 4),
        "shape": shape,
        "probe": probe,
        "greedy": greedy.text,
        "parity": mismatch_metrics(lp_bt, batch.behavior_logprobs_bt, batch.response_mask_bt),
        "seconds": time.perf_counter() - t0,
    }


def format_report(r: dict[str, Any]) -> str:
    """``check_model``'s report as the lines ``forge models check`` prints."""

    def special(name: str) -> str:
        v = r[name]
        return "none" if v is None else f"{v[1]!r} (id {v[0]})"

    verified = (
        "verified (tests/unit/test_model_families.py)"
        if r["verified"]
        else "NOT verified: the run's parity check is the evidence"
    )
    m, s, p = r["memory_gib"], r["shape"], r["parity"]
    probe = r["probe"] if isinstance(r["probe"], str) else r["probe"][-1]["content"]
    return "\n".join(
        [
            f"model      {r['model']}",
            f"family     {r['family']} {r['architectures']}: {verified}",
            f"parameters {r['parameters'] / 1e6:.1f}M, vocabulary {r['vocab']:,}",
            f"tokens     BOS {special('bos')} {'added' if r['adds_bos'] else 'NOT added'}; "
            f"EOS {special('eos')} {'added' if r['adds_eos'] else 'not added'}; "
            f"pad {special('pad')}",
            f"template   {'chat template: chat-message prompts' if r['chat_template'] else 'none (a base model): plain-text prompts'}",
            f"precision  generator.dtype auto -> {r['generator_dtype']} on this machine",
            f"memory     ~{m['generator']:.2f} GiB generator, ~{m['trainer']:.2f} GiB trainer "
            f"(AdamW, float32) at {s.rows} rows x {s.prompt_tokens}+{s.new_tokens} tokens",
            f"greedy     {probe!r} -> {r['greedy']!r}",
            f"parity     generator ({r['generator_dtype']}) vs float32 forward on 4 samples: "
            f"mismatch_kl {p['mismatch_kl']:.3g}, gap mean {p['logprob_gap']:.3g} "
            f"max {p['logprob_gap_max']:.3g}",
            f"took       {r['seconds']:.1f} s",
        ]
    )
