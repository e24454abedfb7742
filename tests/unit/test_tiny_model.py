"""make_tiny_model / ensure_tiny_model / load_model: build locally, reload, determinism, errors."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from forge.models import ensure_tiny_model, load_model, load_tokenizer, make_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), preset="tiny", seed=0)


def test_reloads_with_auto_classes(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert (cfg.num_key_value_heads, cfg.intermediate_size) == (2, 128)
    assert cfg.max_position_embeddings == 512
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert next(model.parameters()).dtype == torch.float32
    # 4 specials + 256 byte symbols; specials at ids 0..3 in this order
    assert cfg.vocab_size == len(tok) == 260
    assert tok.convert_tokens_to_ids(
        ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    ) == [
        0,
        1,
        2,
        3,
    ]
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    assert sorted(model.generation_config.eos_token_id) == [1, 3]


@pytest.mark.parametrize(
    "text", ["Hello, world!", "2 + 2 = 4\n\ttabs  and  spaces", "ünïcödé ✓ 数学"]
)
def test_tokenizer_round_trips(tiny_dir, text):
    tok = load_tokenizer(tiny_dir)
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))  # byte-level, no merges: one token per byte
    assert tok.decode(ids) == text


def test_chat_template(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 2 and ids.count(3) == 2  # special tokens are single ids
    assert tok.decode(ids, skip_special_tokens=True) == "system\nBe brief.\nuser\nhi\nassistant\n"


def test_same_seed_same_weights_other_seed_differs(tmp_path, tiny_dir):
    again = load_file(make_tiny_model(tmp_path / "a", seed=0) / "model.safetensors")
    other = load_file(make_tiny_model(tmp_path / "b", seed=1) / "model.safetensors")
    first = load_file(tiny_dir / "model.safetensors")
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_global_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_tiny_model(tmp_path, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_llama_preset_and_corpus_tokenizer(tmp_path):
    corpus = ["the cat sat on the mat"] * 20 + ["2 + 2 = 4"] * 20
    path = make_tiny_model(tmp_path, preset="llama", corpus=corpus)
    model, tok = load_model(path), load_tokenizer(path)
    assert model.config.model_type == "llama"
    ids = tok("the cat sat")["input_ids"]
    assert len(ids) < len("the cat sat")  # learned merges
    assert tok.decode(ids) == "the cat sat"
    assert model.config.vocab_size == len(tok)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown tiny-model preset: 'huge'"):
        make_tiny_model("/tmp/never-written", preset="huge")


def test_ensure_tiny_model_builds_once_under_concurrency(tmp_path):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_tiny_model("tiny", tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [tmp_path / "tiny-seed0"] * 2
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-seed0"]  # no temp dirs left over
    weights = tmp_path / "tiny-seed0" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert ensure_tiny_model("tiny", tmp_path) == tmp_path / "tiny-seed0"
    assert weights.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_load_model_missing_dir_says_how_to_build(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="forge make-tiny-model") as err:
        load_model(str(missing))
    assert str(missing) in str(err.value)
    with pytest.raises(FileNotFoundError, match="make-tiny-model"):
        load_tokenizer("./relative/missing/dir")


def test_load_model_dtype(tiny_dir):
    assert next(load_model(tiny_dir, dtype="bfloat16").parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype: 'fp8'"):
        load_model(tiny_dir, dtype="fp8")
