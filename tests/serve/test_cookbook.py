"""A tinker-cookbook recipe, unchanged, against ``forge serve``: math_rl's ``arithmetic``
environment (synthetic addition problems, nothing downloaded), 4 steps. The recipe runs from
the venv ``scripts/cookbook_venv.sh`` builds (TINKER_COOKBOOK_PYTHON; scripts/test.sh sets it).
The base model is served under its local path, which is what the recipe's tokenizer lookup
reads. The random tiny model never writes the answer format, so nothing is learned: this
checks that every call the recipe makes is served."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import script_env
from tests.serve.server import serve_process

pytestmark = pytest.mark.slow
KEY = "tml-cookbook-test-key-0123456789"
PYTHON = os.environ.get("TINKER_COOKBOOK_PYTHON", "")


@pytest.mark.skipif(
    not os.path.isfile(PYTHON), reason="no cookbook venv (scripts/cookbook_venv.sh)"
)
def test_the_math_rl_recipe_runs_unchanged(tmp_path):
    pytest.importorskip("tinker")
    from forge.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model("tiny")
    config = f"models:\n  - {{name: {tiny}, path: tiny}}\ndir: {tmp_path / 'ckpt'}\n"
    with serve_process(tmp_path, config, KEY) as url:
        out = subprocess.run(
            [PYTHON, "-m", "tinker_cookbook.recipes.math_rl.train", "env=arithmetic",
             f"model_name={tiny}", "renderer_name=role_colon", f"base_url={url}",
             "lora_rank=8", "groups_per_batch=8", "max_steps=4", "learning_rate=1e-3",
             f"log_path={tmp_path / 'run'}", "behavior_if_log_dir_exists=delete"],
            cwd=str(tmp_path), env=script_env(TINKER_API_KEY=KEY), capture_output=True,
            text=True, timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Training completed successfully" in out.stdout + out.stderr
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all("env/all/reward/total" in s for s in steps)
    saved = (tmp_path / "run" / "checkpoints.jsonl").read_text()
    assert "tinker://" in saved and "sampler_weights/final" in saved
