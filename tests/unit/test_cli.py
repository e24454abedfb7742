"""The ``forge`` command line builds tiny models (its start-up cost, measured in a fresh
interpreter, is checked in tests/checks/test_import_weight.py)."""

from __future__ import annotations

from transformers import AutoConfig

from forge.cli import main


def test_make_tiny_model(tmp_path, capsys):
    assert main(["make-tiny-model", str(tmp_path / "m")]) == 0
    assert "written to" in capsys.readouterr().out
    assert AutoConfig.from_pretrained(tmp_path / "m").model_type == "qwen2"
