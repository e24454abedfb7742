"""A GRPO run whose every user part comes from a package outside the repository.

The doc's ``myplugins`` package (docs/extending.md) is written into a temporary directory
on ``PYTHONPATH``; ``forge run`` then trains a tiny model for a few steps with its data
source, vector reward (Pareto-aggregated), group filter, advantage estimator and loss, all
named by import strings in YAML. The worker processes import the package themselves.
"""

from __future__ import annotations

import json
import os

from forge.models import make_tiny_model
from tests.helpers import forge_run, script_env
from tests.unit.test_extending_docs import doc_modules

CONFIG = """
app: apps.grpo.main
policy: {{model: {model}}}
steps: 3
max_policy_age: 1
data: {{fn: myplugins.data:Arithmetic, kwargs: {{max_value: 9}}}}
rewards: [myplugins.rewards:correct_and_short, exact_match]
rollout:
  prompts_per_step: 2
  group_size: 4
  max_tokens: 4
  tasks: 2
  reward_aggregator: pareto
  filter: myplugins.sampling:some_success
  over_sampling_factor: 2.0
  advantage: myplugins.sampling:centered
  overlong_buffer: 2
generator: {{max_batch_size: 16}}
trainer:
  loss: {{type: myplugins.losses:clipped_pg, kwargs: {{clip: 0.1}}}}
  optimizer: {{lr: 1.0e-4}}
eval: {{at_start: false, at_end: true, max_tokens: 4, reward: exact_match}}
"""


def test_grpo_with_plugins_from_outside_the_repo(tmp_path):
    pkg = tmp_path / "plugins" / "myplugins"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, source in doc_modules().items():
        (pkg / name).write_text(source)
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(CONFIG.format(model=model))
    env = script_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "plugins"), env["PYTHONPATH"]])
    out = forge_run(
        ["--config", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=300, env=env
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # the vector reward's components and the overlong component are logged per step
    keys = set().union(*steps)
    assert {
        "rollout/reward/correct",
        "rollout/reward/short",
        "rollout/reward/exact_match",
        "rollout/reward/overlong",
    } <= keys
    assert "train/ratio_mean" in keys  # the custom loss's own metric reached the log
    assert any("eval/heldout_accuracy" in r for r in rows)

    # A typo in an import string fails at load, before anything spawns.
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.format(model=model).replace("some_success", "some_sucess"))
    out = forge_run(
        ["--config", str(bad), "--run-dir", str(tmp_path / "bad")], timeout=120, env=env
    )
    assert out.returncode == 2
    assert "rollout.filter" in out.stderr and "has no attribute 'some_sucess'" in out.stderr
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()
