"""The tinker-cookbook's on-policy distillation (``distillation/train_on_policy.py``, 0.5.8,
unchanged) against ``forge serve``, through ``scripts/cookbook_distill.py`` on the toy model:
a teacher adapter is trained and saved for sampling, the server restarts (so the teacher is
sampled from its checkpoint on disk), and the recipe runs two steps against that teacher and
saves its final checkpoint. The toy proves the calls; docs/tinker.md records a SmolLM2 run.
The recipe runs from the venv ``scripts/cookbook_venv.sh`` builds (TINKER_COOKBOOK_PYTHON)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env

PYTHON = os.environ.get("TINKER_COOKBOOK_PYTHON", "")


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not os.path.isfile(PYTHON), reason="no cookbook venv (scripts/cookbook_venv.sh)"
)
def test_train_on_policy_runs_unchanged_against_a_teacher_checkpoint(tmp_path):
    pytest.importorskip("tinker")
    out = subprocess.run(
        [sys.executable, "scripts/cookbook_distill.py", "--work", str(tmp_path), "--model", "toy"]
        + ["--steps=2", "--groups=2", "--group-size=2", "--max-tokens=8"]
        + ["--teacher-steps=2", "--teacher-lr=2e-2", f"--cookbook-python={PYTHON}"],
        cwd=str(REPO),
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=540,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "Training completed successfully" in text
    teacher = next(line for line in text.splitlines() if line.startswith("[teacher] tinker://"))
    assert "/sampler_weights/teacher" in teacher
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [0, 1]
    # The student starts as the base model (a zero LoRA update), so a teacher that were the
    # base too would give a KL of ~0; the trained teacher's is well above the sampler's noise.
    kl = [s["teacher_kl"] for s in steps]
    assert all(math.isfinite(k) for k in kl) and kl[0] > 0.01, kl
    saved = (tmp_path / "run" / "checkpoints.jsonl").read_text()
    assert "sampler_weights/final" in saved and "weights/final" in saved
    assert "Traceback" not in (tmp_path / "server.log").read_text()
