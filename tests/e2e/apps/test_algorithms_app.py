"""The GRPO app's algorithm options end to end on a tiny model, in real processes: PPO with a
critic, a reference model that moves (EMA), a learned reward model as a reward component,
and a phase switch of the loss mid-run."""

from __future__ import annotations

import json

from forge.models import make_tiny_model
from forge.models.reward_classifier import make_tiny_reward_model
from tests.helpers import forge_run

CONFIG = """
app: apps.grpo.main
policy: {{model: {model}}}
steps: 4
max_policy_age: 0
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
rewards: [apps.sumdigits.task:sumdigits_reward]
rollout: {{prompts_per_step: 2, group_size: 4, max_tokens: 4, tasks: 2}}
generator: {{max_batch_size: 16}}
trainer:
  loss: {{type: ppo, kl_coef: 0.1}}
  optimizer: {{lr: 1.0e-4}}
reference: {{update: {{type: ema, decay: 0.5}}}}
critic: {{optimizer: {{lr: 1.0e-3}}}}
reward_model: {{model: {rm}, name: rm_score}}
replicas: {{reward_model: 2}}
phases:
  - {{at: 2, name: no-kl, loss: {{kl_coef: 0.0}}, rollout: {{filter: nonzero_variance}}}}
eval: {{at_start: false, at_end: false}}
"""


def test_ppo_with_moving_reference_and_phases(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    cfg = tmp_path / "run.yaml"
    rm = make_tiny_reward_model(tmp_path / "rm", preset="tiny")
    cfg.write_text(CONFIG.format(model=model, rm=rm))
    out = forge_run(["--config", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[grpo] step 2: " in out.stdout and "no-kl" in out.stdout
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if "train/loss" in r}
    assert sorted(steps) == [1, 2, 3, 4]
    # the learned reward model's score is a logged component beside the task's reward
    assert all("rollout/reward/rm_score" in r for r in steps.values())
    assert all("rollout/reward/sumdigits_reward" in r for r in steps.values())
    for r in steps.values():  # the critic trains every step and reports its loss
        assert r["train/critic/value_loss"] >= 0 and "train/critic/explained_variance" in r
    # kl_coef 0.1 for steps 1-2 (versions 0-1), then 0: the loss moves by the KL term only
    assert all("train/kl_ref" in r for r in steps.values())
    assert steps[3]["train/loss"] == steps[3]["train/policy_loss"]


def test_critic_needs_a_per_token_loss(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(CONFIG.format(model=tmp_path, rm=tmp_path).replace("type: ppo", "type: grpo"))
    out = forge_run(["--config", str(cfg)], timeout=120)
    assert out.returncode == 2 and "critic is set" in out.stderr and "'grpo'" in out.stderr
