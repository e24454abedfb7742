"""The reasoning-gym demo (apps/rgym): its config loads through Forge's slots, and a
shortened run trains end to end with real processes and the real package."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, script_env

pytest.importorskip("reasoning_gym")

CONFIG = str(REPO / "apps/rgym/cpu.yaml")


def test_config_loads_and_a_misspelt_dataset_fails_at_load():
    from forge.launch import load_app

    _, cfg = load_app(CONFIG, [])
    assert cfg.rl.data.fn == "reasoning_gym" and cfg.rl.data.kwargs["name"] == "spell_backward"
    assert cfg.rl.reward_fns()[0].name == "spell_backward"
    bad = "rl.rewards=[{fn: reasoning_gym, kwargs: {name: spell_backwards}}]"
    with pytest.raises(ValueError, match=r"rewards\[0\].*did you mean 'spell_backward'"):
        load_app(CONFIG, [bad])
    with pytest.raises(ValueError, match="data: .*no dataset 'spell_backwrd'"):
        load_app(CONFIG, ["rl.data.kwargs.name=spell_backwrd"])
    with pytest.raises(ValueError, match=r"no config key\(s\) \['max_len'\].*'max_word_len'"):
        load_app(CONFIG, ["sft.data.kwargs.max_len=5"])  # the SFT source (Answers) too


def test_short_run_ends_with_its_summary(tmp_path):
    """SFT long enough to teach the format, a few RL steps: the last line, the metrics."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", "--config", CONFIG, "--run-dir", str(run)]
        + ["sft.steps=200", "rl.steps=10", "rl.eval.every=0"],
        capture_output=True,
        text=True,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"success_rate=([\d.]+) baseline=([\d.]+) minutes=([\d.]+)", last)
    assert m, last
    after, before = float(m[1]), float(m[2])
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval/heldout_accuracy"] for r in rows if "eval/heldout_accuracy" in r}
    assert sorted(evals) == [0, 10] and (round(evals[0], 3), round(evals[10], 3)) == (before, after)
    # 200 SFT steps scored 0.25 on the held-out words in a measured run; an answer format the
    # reward cannot read, or a held-out list it cannot score, would give 0.
    assert before > 0.0, last
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 10
    # A step trained only on groups finished before it logs no rollout values of its own.
    rewards = [r["rollout/reward/spell_backward"] for r in steps if "rollout/reward" in r]
    assert len(rewards) >= 5 and all(0.0 < x <= 1.0 for x in rewards), rewards
    assert (run / "curves.png").stat().st_size > 10_000
