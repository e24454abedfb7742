"""The tinker-cookbook's distillation recipes (0.5.8, unchanged) against ``forge serve``,
through ``scripts/cookbook_distill.py`` on the toy model:

- ``distillation/train_on_policy.py``: a teacher adapter is trained and saved for sampling,
  the server restarts (so the teacher is sampled from its checkpoint on disk), and the recipe
  runs two steps against that teacher and saves its final checkpoint;
- ``distillation/sdft.py``: two steps of top-K self-distillation (the teacher's
  ``topk_prompt_logprobs`` as ``[N, K]`` soft targets of ``cross_entropy``).

The toy proves the calls; docs/tinker.md records SmolLM2 runs. The recipes run from the venv
``scripts/cookbook_venv.sh`` builds (TINKER_COOKBOOK_PYTHON)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env

PYTHON = os.environ.get("TINKER_COOKBOOK_PYTHON", "")


NEEDS_VENV = pytest.mark.skipif(
    not os.path.isfile(PYTHON), reason="no cookbook venv (scripts/cookbook_venv.sh)"
)


def _run(tmp_path, *args: str) -> str:
    pytest.importorskip("tinker")
    out = subprocess.run(
        [sys.executable, "scripts/cookbook_distill.py", "--work", str(tmp_path), "--model", "toy"]
        + ["--steps=2", "--groups=2", "--group-size=2", "--max-tokens=8"]
        + [f"--cookbook-python={PYTHON}", *args],
        cwd=str(REPO),
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=540,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    return text


@pytest.mark.timeout(600)
@NEEDS_VENV
def test_train_on_policy_runs_unchanged_against_a_teacher_checkpoint(tmp_path):
    text = _run(tmp_path, "--teacher-steps=2", "--teacher-lr=2e-2")
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


@pytest.mark.timeout(600)
@NEEDS_VENV
def test_sdft_runs_unchanged_with_topk_soft_targets(tmp_path):
    text = _run(tmp_path, "--algorithm=sdft", "--topk=5")
    assert "SDFT training completed successfully" in text
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [0, 1]
    for s in steps:
        assert s["sdft/topk"] == 5 and s["sdft/total_completion_tokens"] > 0  # top 5 per token
        assert 0 < s["sdft/mean_teacher_entropy"] <= math.log(5) + 1e-6
        assert s["grad_norm:mean"] > 0
    saved = (tmp_path / "run" / "checkpoints.jsonl").read_text()
    assert "sampler_weights/final" in saved
