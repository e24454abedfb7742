"""Build small randomly initialised causal LMs locally, with no model hub.

Forge's tests, examples and laptop runs need a real HF model directory (config, safetensors
weights, tokenizer with a chat template) but cannot download one. ``make_tiny_model`` writes
such a directory from scratch in well under a second::

    from forge.models import make_tiny_model
    path = make_tiny_model("/tmp/tiny")          # Qwen2-style, 64 hidden, 2 layers
    model = AutoModelForCausalLM.from_pretrained(path)

The tokenizer is byte-level BPE (the same pre-tokenizer/decoder family as GPT-2 and Qwen2):
with no ``corpus`` it has no merges, so every byte is one token and any text round-trips;
with a ``corpus`` it learns merges up to ``TOKENIZER_VOCAB_WITH_CORPUS`` entries. Special
tokens take ids 0-3: ``<|pad|>``, ``<|endoftext|>`` (eos), ``<|im_start|>``, ``<|im_end|>``.

Input and output embeddings are tied (``tie_word_embeddings=True``), as in Qwen2.5-0.5B: it
halves the parameter count of these embedding-dominated models and exercises the tied-weight
path that weight sync to a generator must handle. Weights are saved in float32.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
TOKENIZER_VOCAB_WITH_CORPUS = 512
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, as used by Qwen. Generation ends with <|im_end|>, which is therefore also an eos id
# in the model's generation_config.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyPreset:
    """Architecture sizes for one preset; ``family`` picks the HF config class."""

    family: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    extra: tuple[tuple[str, object], ...] = ()  # family-specific config fields


# A sliding window this short bites in tests whose rows run to a few dozen tokens.
_TEST_WINDOW = 8
PRESETS: dict[str, TinyPreset] = {
    "tiny": TinyPreset("qwen2", 64, 2, 4, 2, 128),
    "mini": TinyPreset("qwen2", 128, 2, 4, 2, 256),  # the CPU demo's policy (~0.33M params)
    "small": TinyPreset("qwen2", 256, 4, 8, 4, 688),
    "llama": TinyPreset("llama", 64, 2, 4, 2, 128),
    # One tiny preset per family forge verifies (docs/models.md): what each treats as special.
    "qwen3": TinyPreset("qwen3", 64, 2, 4, 2, 128, extra=(("head_dim", 16),)),  # q/k norm
    "gemma3": TinyPreset(  # sliding and global layers, q/k norm, scaled embedding
        "gemma3",
        64,
        2,
        4,
        1,
        128,
        extra=(
            ("head_dim", 32),
            ("sliding_window", _TEST_WINDOW),
            ("layer_types", ["sliding_attention", "full_attention"]),
            ("query_pre_attn_scalar", 32),
        ),
    ),
    "mistral": TinyPreset("mistral", 64, 2, 4, 2, 128, extra=(("sliding_window", _TEST_WINDOW),)),
    "phi3": TinyPreset("phi3", 64, 2, 4, 2, 128),  # fused qkv and gate_up projections
}
FAMILY_PRESETS = ("llama", "tiny", "qwen3", "gemma3", "mistral", "phi3")  # "tiny" is qwen2


def _build_tokenizer(corpus: list[str] | None):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with pad/eos and a ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if corpus:
        tok = Tokenizer(models.BPE())
    else:
        vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *alphabet])}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # Exactly Qwen2's normaliser and pre-tokeniser: AutoTokenizer rebuilds qwen2-type
    # tokenizers with these, so matching them keeps the saved and reloaded tokenizers equal.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if corpus:
        trainer = trainers.BpeTrainer(
            vocab_size=TOKENIZER_VOCAB_WITH_CORPUS,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=alphabet,
            show_progress=False,
        )
        tok.train_from_iterator(corpus, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max(p.max_position_embeddings for p in PRESETS.values()),
    )


def _build_config(preset: TinyPreset, tokenizer):
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    config_cls = {
        "qwen2": Qwen2Config,
        "llama": LlamaConfig,
        "qwen3": Qwen3Config,
        "gemma3": Gemma3TextConfig,
        "mistral": MistralConfig,
        "phi3": Phi3Config,
    }[preset.family]
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, IM_END_TOKEN)]
    return config_cls(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=eos_ids[0],
        eos_token_id=eos_ids,
        dtype="float32",
        **dict(preset.extra),
    )


def make_tiny_model(
    out_dir: str | os.PathLike,
    preset: str = "tiny",
    seed: int = 0,
    corpus: list[str] | None = None,
) -> Path:
    """Write a randomly initialised model and its tokenizer to ``out_dir`` and return it.

    Args:
        out_dir: directory to create (or overwrite files in).
        preset: one of ``PRESETS`` ("tiny", "small", "llama", one per family in
            ``FAMILY_PRESETS``).
        seed: weight-initialisation seed; the same seed gives bit-identical weights.
            The global torch RNG is left untouched.
        corpus: optional texts to learn BPE merges from; default is a pure byte vocabulary.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset: {preset!r}; choose one of {sorted(PRESETS)}")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = PRESETS[preset]
    tokenizer = _build_tokenizer(corpus)
    config = _build_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def default_cache_dir() -> Path:
    """Where ``ensure_tiny_model`` keeps built models unless told otherwise."""
    return Path.home() / ".cache" / "forge" / "tiny-models"


def ensure_tiny_model(
    preset: str = "tiny",
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
) -> Path:
    """Return ``cache_dir/<preset>-seed<seed>``, building it first if it does not exist.

    Safe under concurrent callers: each builds into its own temporary directory and renames it
    into place atomically, so nobody ever sees a half-written model; the loser of a race
    discards its copy and uses the winner's (identical, since building is deterministic).
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / f"{preset}-seed{seed}"
    if (final / "config.json").exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache))
    try:
        make_tiny_model(tmp, preset=preset, seed=seed)
        with contextlib.suppress(OSError):  # another process renamed first: use theirs
            os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if not (final / "config.json").exists():
        raise RuntimeError(f"building tiny model into {final} failed; remove it and retry")
    return final
