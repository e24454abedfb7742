"""``docs/config.md`` is generated from the config dataclasses and kept current; every field
of every config section has a docstring, and its choices are a ``Literal`` the loader checks."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import pytest

from forge.config import config_from_dict
from forge.config.config_docs import ROOTS, _classes, _load, reference_markdown, type_text
from forge.config.describe import field_docs
from tests.helpers import REPO

CLASSES = _classes([_load(r) for r in ROOTS])


def test_docs_config_md_is_current():
    current = (REPO / "docs/config.md").read_text()
    assert reference_markdown() == current, (
        "docs/config.md is stale: run `python -m forge.config.config_docs > docs/config.md`"
    )


def test_the_reference_reaches_the_run_configs_sections():
    names = {c.__name__ for c in CLASSES}
    assert {
        "RLConfig",
        "TrainerConfig",
        "LossConfig",
        "GeneratorConfig",
        "RolloutConfig",
        "PipelineConfig",
        "Stage",
        "ServeConfig",
        "EvalSet",
        "PolicyConfig",
    } <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_config_field_has_a_docstring(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.init and not docs.get(f.name)]
    assert missing == [], f"{cls.__qualname__}: add a docstring under {missing}"


def test_choices_are_literals_the_loader_checks_with_the_choices_listed():
    hints = typing.get_type_hints(_load("forge.training.trainer_config:TrainerConfig"))
    assert typing.get_origin(hints["parallelism"]) is Literal
    assert type_text(hints["parallelism"]) == '"ddp" \\| "fsdp"'
    with pytest.raises(ValueError) as info:
        config_from_dict(
            _load("forge.training.trainer_config:TrainerConfig"),
            {"model": "/m", "parallelism": "fsdb"},
        )
    assert "parallelism: 'fsdb' is not one of ['ddp', 'fsdp'] (did you mean 'fsdp'?)" in str(
        info.value
    )
