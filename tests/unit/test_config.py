"""forge.config: YAML -> overrides -> ${...} interpolation -> typed dataclasses, and back.

Also covers the forge.settings accessors, which config's ``${env:...}`` reads through.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from forge import settings
from forge.config import (
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    load_config_dict,
)
from forge.types import SamplingParams


@dataclass
class TrainerConfig:
    lr: float
    steps: int = 100
    loss: Literal["grpo", "dapo", "gspo"] = "grpo"
    clip: tuple[float, float] = (0.2, 0.28)


@dataclass
class GeneratorConfig:
    n: int = 4
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class ExtraConfig:
    flag: bool = False
    list: list[int] = field(default_factory=list)
    name: str = "run"
    weights: dict[str, float] = field(default_factory=dict)
    seed: int | None = None


@dataclass
class RunConfig:
    trainer: TrainerConfig
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    x: ExtraConfig = field(default_factory=ExtraConfig)
    max_prompt_len: int = 16
    max_response_len: int = 32


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_loads_nested_dataclasses_with_defaults(tmp_path):
    path = write(
        tmp_path,
        """
        trainer:
          lr: 3e-4        # YAML 1.1 would make this a string; Forge reads YAML 1.2 floats
          loss: dapo
        generator:
          sampling: {temperature: 0.7, stop: ["</answer>"]}
        x:
          name: yes       # YAML 1.1 would make this True
        """,
    )
    cfg = load_config(path, schema=RunConfig)
    assert cfg.trainer == TrainerConfig(lr=3e-4, steps=100, loss="dapo", clip=(0.2, 0.28))
    assert cfg.generator.n == 4
    assert cfg.generator.sampling.temperature == 0.7
    assert cfg.generator.sampling.stop == ["</answer>"]
    assert cfg.x.name == "yes"
    assert cfg.max_prompt_len == 16


def test_int_is_accepted_for_float_and_converted(tmp_path):
    cfg = load_config(write(tmp_path, "trainer: {lr: 1}\n"), schema=RunConfig)
    assert cfg.trainer.lr == 1.0 and type(cfg.trainer.lr) is float


def test_overrides_parse_values_as_yaml(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1, steps: 3}\n")
    overrides = ["trainer.lr=1e-5", "generator.n=8", "x.flag=true", "x.list=[1,2]", "x.seed=7"]
    cfg = load_config(path, overrides, schema=RunConfig)
    assert cfg.trainer.lr == 1e-5
    assert cfg.trainer.steps == 3
    # generator and x are absent from the file: overrides create the sections.
    assert cfg.generator.n == 8
    assert cfg.x.flag is True
    assert cfg.x.list == [1, 2]
    assert cfg.x.seed == 7


def test_override_without_equals_is_an_error(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1}\n")
    with pytest.raises(ValueError, match=r"override 'trainer\.lr' must look like"):
        load_config(path, ["trainer.lr"], schema=RunConfig)


def test_override_into_list_item_and_through_a_scalar(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1}\nx: {list: [1, 2, 3]}\n")
    assert load_config(path, ["x.list.1=5"], schema=RunConfig).x.list == [1, 5, 3]
    with pytest.raises(ValueError, match="'trainer.lr' is not a mapping"):
        load_config(path, ["trainer.lr.warmup.steps=3"], schema=RunConfig)


def test_override_with_wrong_type_names_the_override(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1}\n")
    with pytest.raises(ValueError) as info:
        load_config(path, ["trainer.steps=ten"], schema=RunConfig)
    msg = str(info.value)
    assert (
        "trainer.steps" in msg and "'ten'" in msg and "set by override 'trainer.steps=ten'" in msg
    )


def test_reference_keeps_type_and_resolves_recursively(tmp_path):
    path = write(
        tmp_path,
        """
        max_prompt_len: 10
        max_response_len: ${max_prompt_len}
        generator:
          n: ${max_response_len}
          sampling: {max_tokens: "${generator.n}"}
        trainer: {lr: 0.5, steps: 3}
        x: {name: "run-${trainer.steps}-of-${generator.n}-lr${trainer.lr}"}
        """,
    )
    cfg = load_config(path, schema=RunConfig)
    assert cfg.max_response_len == 10 and type(cfg.max_response_len) is int
    assert cfg.generator.n == 10
    assert cfg.generator.sampling.max_tokens == 10
    assert cfg.x.name == "run-3-of-10-lr0.5"


def test_reference_to_a_mapping_copies_the_section(tmp_path):
    path = write(tmp_path, "base: {lr: 0.5}\ntrainer: ${base}\n")
    assert load_config_dict(path)["trainer"] == {"lr": 0.5}


def test_override_applies_before_interpolation(tmp_path):
    path = write(tmp_path, "max_prompt_len: 4\ngenerator: {n: '${max_prompt_len}'}\n")
    assert load_config_dict(path, ["max_prompt_len=9"])["generator"]["n"] == 9


def test_arithmetic(tmp_path):
    path = write(
        tmp_path,
        """
        a: {b: 12}
        max_prompt_len: 100
        max_response_len: 28
        total: ${max_prompt_len + max_response_len}
        double: ${a.b * 2}
        nested: ${(a.b - 2) // 3}
        ratio: ${a.b / 8}
        neg: ${-a.b + 1.5}
        text: "len=${max_prompt_len * 2}"
        """,
    )
    data = load_config_dict(path)
    assert data["total"] == 128 and type(data["total"]) is int
    assert data["double"] == 24
    assert data["nested"] == 3  # (12 - 2) // 3
    assert data["ratio"] == 1.5
    assert data["neg"] == -10.5
    assert data["text"] == "len=200"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("${__import__('os').getcwd()}", "unsupported expression"),
        ("${a.name * 2}", "which is not a number"),
        ("${a.nope + 1}", "missing key 'a.nope'"),
        ("${a.size / 0}", "division by zero"),
        ("${a.missing}", "missing key 'a.missing'"),
    ],
)
def test_bad_interpolations_are_errors(tmp_path, expr, message):
    path = write(tmp_path, f'a: {{name: x, size: 3}}\nb: "{expr}"\n')
    with pytest.raises(ValueError, match=message) as info:
        load_config_dict(path)
    assert str(path) in str(info.value) and "'b'" in str(info.value)


def test_env_interpolation(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_TEST_STEPS", "42")
    monkeypatch.setenv("FORGE_TEST_NAME", "alice")
    monkeypatch.delenv("FORGE_TEST_UNSET", raising=False)
    path = write(
        tmp_path,
        """
        steps: ${env:FORGE_TEST_STEPS}
        name: ${env:FORGE_TEST_NAME}
        fallback: ${env:FORGE_TEST_UNSET, 0.5}
        fallback_text: ${env:FORGE_TEST_UNSET,/tmp/out}
        embedded: "user-${env:FORGE_TEST_NAME}-${env:FORGE_TEST_STEPS}"
        default_from_key: ${env:FORGE_TEST_UNSET,${steps}}
        """,
    )
    data = load_config_dict(path)
    assert data["steps"] == 42 and type(data["steps"]) is int
    assert data["name"] == "alice"
    assert data["fallback"] == 0.5
    assert data["fallback_text"] == "/tmp/out"
    assert data["embedded"] == "user-alice-42"
    assert data["default_from_key"] == 42


def test_env_without_default_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FORGE_TEST_UNSET", raising=False)
    path = write(tmp_path, "a: ${env:FORGE_TEST_UNSET}\n")
    with pytest.raises(ValueError, match="'FORGE_TEST_UNSET' is not set"):
        load_config_dict(path)


def test_cycle_error_names_the_chain(tmp_path):
    path = write(tmp_path, "a: ${b}\nb: ${c.d}\nc: {d: '${a}'}\n")
    with pytest.raises(ValueError, match=r"interpolation cycle: a -> b -> c\.d -> a"):
        load_config_dict(path)


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1, stpes: 5}\n", name="my_run.yaml")
    with pytest.raises(ValueError) as info:
        load_config(path, schema=RunConfig)
    msg = str(info.value)
    assert str(path) in msg
    assert "trainer.stpes" in msg
    assert "did you mean 'steps'?" in msg
    assert "allowed keys: lr, steps, loss, clip" in msg


@pytest.mark.parametrize(
    ("yaml_text", "key", "shown"),
    [
        ('trainer: {lr: "abc"}', "trainer.lr", "expected float, got 'abc'"),
        ('trainer: {lr: "1e-5"}', "trainer.lr", "expected float, got '1e-5'"),
        ("trainer: {lr: 0.1, steps: true}", "trainer.steps", "expected int, got True"),
        ("trainer: {lr: 0.1, steps: 2.5}", "trainer.steps", "expected int, got 2.5"),
        ("trainer: {lr: 0.1}\nx: {name: 5}", "x.name", "expected str, got 5"),
        ("trainer: {lr: 0.1}\nx: {flag: 1}", "x.flag", "expected bool, got 1"),
        ("trainer: {lr: 0.1}\nx: {list: [1, a]}", "x.list.1", "expected int, got 'a'"),
        ("trainer: {lr: 0.1}\nx: {weights: {a: x}}", "x.weights.a", "expected float, got 'x'"),
        ("trainer: {lr: 0.1}\ngenerator: 3", "generator", "expected mapping for Generator"),
        ("trainer: {lr: 0.1, clip: [0.1]}", "trainer.clip", "expected 2 items"),
    ],
)
def test_wrong_types_are_errors(tmp_path, yaml_text, key, shown):
    path = write(tmp_path, yaml_text + "\n")
    with pytest.raises(ValueError) as info:
        load_config(path, schema=RunConfig)
    msg = str(info.value)
    assert f"{key}: {shown}" in msg
    assert str(path) in msg


def test_missing_required_value(tmp_path):
    path = write(tmp_path, "generator: {n: 2}\n")
    with pytest.raises(ValueError, match="trainer: missing required value"):
        load_config(path, schema=RunConfig)
    path = write(tmp_path, "trainer: {steps: 2}\n")
    with pytest.raises(ValueError, match=r"trainer\.lr: missing required value"):
        load_config(path, schema=RunConfig)


def test_literal_violation_lists_choices(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1, loss: grpoo}\n")
    with pytest.raises(ValueError) as info:
        load_config(path, schema=RunConfig)
    assert "trainer.loss: 'grpoo' is not one of ['grpo', 'dapo', 'gspo']" in str(info.value)
    assert "did you mean 'grpo'?" in str(info.value)


def test_all_errors_are_reported_together(tmp_path):
    path = write(tmp_path, "trainer: {lr: abc, steps: true, loss: ppo}\nmax_prompt_len: x\n")
    with pytest.raises(ValueError, match=r"\(4 errors\)") as info:
        load_config(path, schema=RunConfig)
    for key in ("trainer.lr", "trainer.steps", "trainer.loss", "max_prompt_len"):
        assert f"  - {key}:" in str(info.value)


def test_post_init_errors_are_reported_with_their_key(tmp_path):
    path = write(tmp_path, "trainer: {lr: 0.1}\ngenerator: {sampling: {top_p: 1.5}}\n")
    with pytest.raises(ValueError, match=r"generator\.sampling: SamplingParams: .*top_p"):
        load_config(path, schema=RunConfig)


def test_dump_then_load_round_trips(tmp_path):
    cfg = RunConfig(
        trainer=TrainerConfig(lr=1e-5, steps=7, loss="gspo", clip=(0.1, 0.3)),
        generator=GeneratorConfig(n=8, sampling=SamplingParams(temperature=0.0, stop=["\n\n"])),
        # Strings that a YAML reader could mistake for other types must survive the trip.
        x=ExtraConfig(flag=True, list=[3, 1], name="1e-5", weights={"yes": 2.0}, seed=None),
        max_prompt_len=64,
    )
    out = dump_config(cfg, tmp_path / "run" / "config.yaml")
    assert out.exists()
    assert load_config(out, schema=RunConfig) == cfg
    assert config_to_dict(cfg)["trainer"]["clip"] == [0.1, 0.3]


def test_config_from_dict_requires_a_dataclass_schema():
    with pytest.raises(TypeError, match="schema must be a dataclass type"):
        config_from_dict(dict, {})


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ValueError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"), schema=RunConfig)


def test_env_accessors(monkeypatch, tmp_path):
    for name in ("FORGE_LOG_LEVEL", "FORGE_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FORGE_CACHE_DIR", raising=False)
    assert settings.get_log_level() == "INFO"
    assert settings.get_run_dir() == Path("runs")
    assert settings.get_cache_dir() == tmp_path / ".cache" / "forge"

    monkeypatch.setenv("FORGE_LOG_LEVEL", "debug")
    monkeypatch.setenv("FORGE_RUN_DIR", str(tmp_path / "r"))
    assert settings.get_log_level() == "DEBUG"
    assert settings.get_run_dir() == tmp_path / "r"

    monkeypatch.setenv("FORGE_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="FORGE_LOG_LEVEL='LOUD'"):
        settings.get_log_level()
