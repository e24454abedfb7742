"""GGUF files and shipped models as ``policy.model``: what resolves, and the errors that name
the fix, raised when the config loads (before anything spawns). The real conversion runs in
tests/e2e/training/test_real_model.py."""

from __future__ import annotations

import importlib.util

import pytest

from forge.config import load_config
from forge.models import gguf
from forge.models.gguf import ShippedModel, is_model_spec, resolve_model
from forge.run.rl_config import RLConfig


def test_directories_and_hub_ids_pass_through(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert resolve_model("from-run") == "from-run"
    assert is_model_spec("SmolLM2-135M-Instruct") and is_model_spec("/x/m.Q4_1.GGUF")
    assert not is_model_spec("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no GGUF file at .*nope\.gguf"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_a_missing_package_names_its_install_command(monkeypatch):
    fake = ShippedModel("forge_no_such_package", "m.gguf", "no-such-package==1.0", "a model")
    monkeypatch.setitem(gguf.SHIPPED, "fake-model", fake)
    with pytest.raises(ValueError, match=r"pip install no-such-package==1\.0 gguf accelerate"):
        resolve_model("fake-model")


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs gguf")
def test_a_file_that_is_not_gguf_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        resolve_model(str(bad))
    assert not any((tmp_path / "cache").rglob("config.json"))  # nothing half-converted


def test_the_config_fails_at_load_naming_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        f"policy: {{model: {tmp_path / 'missing.gguf'}}}\n"
        "data: {fn: apps.arith.task:Addition}\nrewards: [apps.arith.task:correct]\n"
    )
    with pytest.raises((FileNotFoundError, ValueError), match="missing.gguf"):
        load_config(path, schema=RLConfig)


def test_an_architecture_transformers_does_not_know_is_refused_at_load(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no_such_family", "vocab_size": 8}')
    path = tmp_path / "run.yaml"
    path.write_text(
        f"policy: {{model: {model}}}\n"
        "data: {fn: apps.arith.task:Addition}\nrewards: [apps.arith.task:correct]\n"
    )
    with pytest.raises(ValueError, match="model_type 'no_such_family' is unknown to transformers"):
        load_config(path, schema=RLConfig)


def test_a_tokenizer_whose_eos_disagrees_with_the_config_is_refused_at_load(tmp_path):
    import json

    from forge.models import make_tiny_model

    model = make_tiny_model(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    config["eos_token_id"] = [7]  # the tokenizer's EOS is 1
    (model / "config.json").write_text(json.dumps(config))
    path = tmp_path / "run.yaml"
    path.write_text(
        f"policy: {{model: {model}}}\n"
        "data: {fn: apps.arith.task:Addition}\nrewards: [apps.arith.task:correct]\n"
    )
    with pytest.raises(ValueError, match=r"eos id is 1 but the model's config says \[7\]"):
        load_config(path, schema=RLConfig)
