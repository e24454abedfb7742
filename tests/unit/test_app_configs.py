"""Every shipped app config parses into its app's typed schema (validated, not run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge.launch import load_app
from tests.helpers import REPO

CONFIGS = sorted(
    str(p.relative_to(REPO))
    for p in [*REPO.glob("apps/*/*.yaml"), *REPO.glob("apps/*/configs/*.yaml")]
)


@pytest.mark.parametrize("path", CONFIGS)
def test_config_validates(path):
    module, cfg = load_app(REPO / path, [])
    assert cfg.app == module.__name__


def test_there_are_configs():
    assert "apps/sumdigits/cpu.yaml" in CONFIGS
    assert "apps/grpo/configs/qwen3_1_7b.yaml" in CONFIGS
    assert Path(REPO / "apps/grpo/notebook.ipynb").is_file()
