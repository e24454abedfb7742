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


# Configs that name the output of another run (the recipe's first command): validated with
# a stand-in model there, and refused at load without it.
NEEDS_A_RUN = {"apps/arith/smollm2_distill_trained.yaml": "rl.teacher.model"}


@pytest.mark.parametrize("path", CONFIGS)
def test_config_validates(path, tmp_path, monkeypatch):
    overrides = []
    if path in NEEDS_A_RUN:
        monkeypatch.chdir(tmp_path)  # where the other run has not run (its path is relative)
        with pytest.raises(ValueError, match="no model directory there"):
            load_app(REPO / path, [])
        from forge.models import make_tiny_model

        overrides = [f"{NEEDS_A_RUN[path]}={make_tiny_model(tmp_path / 'teacher')}"]
    module, cfg = load_app(REPO / path, overrides)
    assert cfg.app == module.__name__


def test_there_are_configs():
    assert "apps/sumdigits/cpu.yaml" in CONFIGS
    assert "apps/grpo/configs/qwen3_1_7b.yaml" in CONFIGS
    assert Path(REPO / "apps/grpo/notebook.ipynb").is_file()
