"""GRPO on a verifiers environment through ``forge run`` (the environment's own tests:
tests/integration/envs/test_verifiers.py)."""

from __future__ import annotations

import json

import pytest

from forge.models import make_tiny_model
from tests.helpers import forge_run, script_env
from tests.integration.envs.test_verifiers import SUM


@pytest.mark.timeout(180)
def test_grpo_trains_on_a_verifiers_env(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    load = {"load": SUM}
    config = tmp_path / "vf.yaml"
    config.write_text(f"""
app: apps.grpo.main
policy: {{model: {model}}}
steps: 3
data: {{fn: verifiers, kwargs: {json.dumps(load)}}}
env: {{fn: {{fn: verifiers, kwargs: {json.dumps(load)}}}, max_turns: 2, max_context_tokens: 128}}
rollout: {{prompts_per_step: 2, group_size: 4, max_tokens: 4, tasks: 2, filter: keep_all}}
generator: {{max_batch_size: 16}}
trainer: {{optimizer: {{lr: 1.0e-4}}}}
eval: {{at_start: false, at_end: false}}
metrics: [jsonl]
""")
    out = forge_run(
        ["--config", str(config), "--run-dir", str(tmp_path / "run")],
        timeout=170,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("train/loss" in r for r in rows) == 3
    scored = [r for r in rows if "rollout/reward/correct" in r]
    assert scored  # the rollouts logged the rubric's components, by name
    for r in scored:
        assert 0.0 <= r["rollout/reward/brief"] <= 0.5  # weight 0.5
        # The run's reward (weighted_sum of the components) is verifiers' total.
        total = r["rollout/reward/correct"] + r["rollout/reward/brief"]
        assert r["rollout/reward"] == pytest.approx(total)
