"""The parity check before the first step, end to end: a run whose generator computes in
another precision than its trainer, with a bound below that gap, stops before any update with
``PolicyMismatchError`` naming both precisions; the same run within its bound trains and logs
the check."""

from __future__ import annotations

from forge.models import make_tiny_model
from tests.helpers import forge_run

CONFIG = """
app: apps.grpo.main
policy: {{model: {model}}}
steps: 1
max_policy_age: 0
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
rewards: [apps.sumdigits.task:sumdigits_reward]
rollout: {{prompts_per_step: 2, group_size: 2, max_tokens: 8, tasks: 2}}
generator: {{dtype: bfloat16}}
trainer: {{autocast: null}}
parity: {{max_mismatch_kl: {bound}}}
eval: {{at_start: false, at_end: false}}
"""


def _run(tmp_path, bound: float):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    cfg = tmp_path / f"run{bound}.yaml"
    cfg.write_text(CONFIG.format(model=model, bound=bound))
    return forge_run(["--config", str(cfg), "--run-dir", str(tmp_path / f"run{bound}")], 300)


def test_a_precision_gap_above_the_bound_stops_the_run_before_any_update(tmp_path):
    out = _run(tmp_path, 1e-12)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "PolicyMismatchError" in text and "parity.max_mismatch_kl=1e-12" in text
    assert "generator computes in bfloat16 and the trainer in float32" in text
    assert not (tmp_path / "run1e-12" / "model").exists()  # nothing was trained or exported


def test_within_the_bound_the_run_trains_and_logs_the_check(tmp_path):
    out = _run(tmp_path, 0.5)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[forge] parity at start: mismatch_kl" in out.stdout + out.stderr
