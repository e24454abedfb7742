"""``forge models check``: the report on a real (tiny, random) model, and the errors a
model that misbehaves gets."""

from __future__ import annotations

import pytest

from forge.models import load_model, load_tokenizer, make_tiny_model
from forge.models.check import BatchShape, check_model, check_special_ids, format_report


def test_the_report_names_family_tokens_template_memory_and_parity(tmp_path):
    path = make_tiny_model(tmp_path / "g", preset="gemma3")
    r = check_model(str(path), BatchShape(rows=8, prompt_tokens=16, new_tokens=8), tokens=6)
    assert r["family"] == "gemma3_text" and r["verified"]
    assert r["eos"][0] == 1 and r["chat_template"] and not r["adds_bos"]
    assert r["memory_gib"]["trainer"] > 0 and r["parity"]["mismatch_kl"] < 1e-3
    text = format_report(r)
    for line in ("family     gemma3_text", "tokens     BOS none NOT added", "parity     "):
        assert line in text


def test_a_tokenizer_whose_ids_disagree_with_the_config_is_refused(tmp_path):
    path = make_tiny_model(tmp_path / "m")
    model, tok = load_model(path), load_tokenizer(path)
    check_special_ids(model.config, tok, "m")  # its own tokenizer agrees
    model.config.eos_token_id = [7]
    with pytest.raises(ValueError, match=r"eos id is 1 but the model's config says \[7\]"):
        check_special_ids(model.config, tok, "m")


def test_the_cli_names_a_missing_model(tmp_path, capsys):
    from forge.cli.main import main

    assert main(["models", "check", str(tmp_path / "nothing")]) == 2
    assert "no model directory" in capsys.readouterr().err
