"""Evaluation sets during a run and ``forge eval`` on its saved policy: an environment set
with n samples (pass@k) and a single-turn set from another data source, logged as
eval/<name>/... rows, then evaluated again from the run directory."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO, forge_run, script_env

SETS = (
    "rl.eval.sets=[{name: sampled, n: 2, k: [1, 2], temperature: 1.0, limit: 4}, "
    "{name: digits, data: {fn: apps.sumdigits.task:SumDigits, kwargs: {digits_min: 1, "
    "digits_max: 2}}, rewards: [apps.sumdigits.task:sumdigits_reward], limit: 8}]"
)


def test_eval_sets_during_a_run_and_forge_eval_after(tmp_path):
    run = tmp_path / "run"
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    out = forge_run(
        [
            "--config",
            str(REPO / "apps/guess/cpu.yaml"),
            "--run-dir",
            str(run),
            "sft.steps=20",
            "rl.steps=4",
            "rl.eval.every=2",
            "rl.eval.at_start=false",
            SETS,
        ],
        timeout=280,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/sampled/pass@2" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert r["eval/sampled/samples"] == 8 and r["eval/digits/tasks"] == 8
        assert 0 <= r["eval/sampled/pass@1"] <= r["eval/sampled/pass@2"] <= 1
        assert "eval/sampled/turns" in r and "eval/digits/reward/sumdigits_reward" in r
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "eval",
            "--config",
            str(run / "config.yaml"),
            "--checkpoint",
            str(run),
            "--sets",
            "heldout,digits",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    assert "pass@1" in shown.stdout and "digits" in shown.stdout
    result = json.loads((run / "eval.json").read_text())
    assert result["model"] == str(run / "rl" / "model")
    assert set(result["sets"]) == {"heldout", "digits"} and result["sets"]["digits"]["tasks"] == 8
