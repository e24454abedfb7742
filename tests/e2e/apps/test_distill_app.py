"""On-policy distillation end to end (``forge run``, apps/grpo with a ``teacher:`` section):
pure distillation (no reward, groups of one) brings the student's KL to a teacher down;
self-distillation from the student's own weights (following its pushed versions) shown a
privileged prompt mixes with a reward; a teacher with another tokenizer is refused before
anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from forge.models import load_model, load_tokenizer, make_tiny_model
from tests.helpers import forge_run

LETTERS = "abcdefghijklmnopqrstuvwxyz"

PURE = """
app: apps.grpo.main
policy: {{model: {student}}}
steps: 12
max_policy_age: 0
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
teacher: {{model: {teacher}}}
rollout: {{prompts_per_step: 8, group_size: 1, max_tokens: 16, tasks: 8}}
generator: {{max_batch_size: 8}}
trainer:
  loss: {{type: grpo}}
  optimizer: {{lr: 1.0e-2}}
eval: {{at_start: false, at_end: false}}
"""


def letter_teacher(out: Path, steps: int = 10) -> Path:
    """A tiny model (the student's tokenizer, other weights) trained in process to put ~98%
    of its next-token mass on the 26 lowercase letters after any context: a teacher whose
    preference a student can find by sampling (a tenth of a random student's samples)."""
    path = make_tiny_model(out, seed=1)
    model, tok = load_model(path), load_tokenizer(path)
    letters = torch.tensor([tok.convert_tokens_to_ids(c) for c in LETTERS])
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        ids = torch.randint(4, len(tok), (16, 32), generator=gen)
        loss = -torch.log_softmax(model(input_ids=ids).logits, -1)[..., letters].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(path)
    return path


def _run(tmp_path: Path, text: str) -> dict[int, dict]:
    cfg, run = tmp_path / "run.yaml", tmp_path / "run"
    cfg.write_text(text)
    out = forge_run(["--config", str(cfg), "--run-dir", str(run)], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "train/loss" in r}


def test_pure_distillation_brings_the_students_kl_to_the_teacher_down(tmp_path):
    student = make_tiny_model(tmp_path / "student", seed=0)
    teacher = letter_teacher(tmp_path / "teacher")
    steps = _run(tmp_path, PURE.format(student=student, teacher=teacher))
    assert sorted(steps) == list(range(1, 13))
    kl = [steps[s]["rollout/teacher_kl"] for s in sorted(steps)]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    assert first > 1.0 and last < 0.5 * first, kl  # (3.4 -> 0.2-0.3 when written)
    assert all(r["rollout/distill_share"] == 1.0 for r in steps.values())  # no reward
    assert all(0.0 < r["rollout/teacher_entropy"] < 5.6 for r in steps.values())
    assert not any(k.startswith("rollout/reward") for r in steps.values() for k in r)


SELF = """
app: apps.grpo.main
policy: {{model: {student}}}
steps: 3
max_policy_age: 0
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
rewards: [apps.sumdigits.task:sumdigits_reward]
teacher:
  model: policy
  prompt: "{{prompt}}(The answer is {{target}}; a good answer: {{best_response}}) "
  coef: 0.5
  discount: 0.9
  update: {{type: reset}}  # the student's current weights: it pulls every pushed version
rollout: {{prompts_per_step: 4, group_size: 4, max_tokens: 8, tasks: 4}}
generator: {{max_batch_size: 16}}
trainer:
  loss: {{type: grpo}}
  optimizer: {{lr: 1.0e-4}}
eval: {{at_start: false, at_end: false}}
"""


def test_self_distillation_with_a_privileged_prompt_mixes_with_the_reward(tmp_path):
    student = make_tiny_model(tmp_path / "student", seed=0)
    steps = _run(tmp_path, SELF.format(student=student))
    assert sorted(steps) == [1, 2, 3]
    first = steps[1]
    # The teacher is the student's own weights, so only the privileged prompt sets them apart.
    assert first["rollout/teacher_kl"] != 0.0
    assert all(0.0 < r["rollout/distill_share"] <= 1.0 for r in steps.values())
    assert all("rollout/reward" in r for r in steps.values())


def test_a_teacher_with_another_tokenizer_is_refused_before_anything_starts(tmp_path):
    student = make_tiny_model(tmp_path / "student", seed=0)
    other = make_tiny_model(tmp_path / "other", corpus=["the teacher's own merges"] * 20)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(PURE.format(student=student, teacher=other))
    out = forge_run(["--config", str(cfg), "--run-dir", str(tmp_path / "run")], timeout=120)
    assert out.returncode != 0
    err = out.stdout + out.stderr
    assert "have different tokenizers" in err and "cross-tokenizer" in err, err[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


GKD = """
app: apps.grpo.main
policy: {{model: {student}}}
steps: 10
max_policy_age: 0
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
teacher: {{model: {teacher}, signal: gkd, top_k: 16, beta: 0.5}}
rollout: {{prompts_per_step: 8, group_size: 1, max_tokens: 16, tasks: 8}}
generator: {{max_batch_size: 8}}
trainer:
  loss: {{type: grpo}}
  optimizer: {{lr: 1.0e-2}}
eval: {{at_start: false, at_end: false}}
"""


def test_pure_gkd_brings_the_students_kl_to_the_teacher_down(tmp_path):
    """No reward and no distillation advantage: the trainer's GKD term against the teacher's
    top-16 is the only signal."""
    student = make_tiny_model(tmp_path / "student", seed=0)
    teacher = letter_teacher(tmp_path / "teacher")
    steps = _run(tmp_path, GKD.format(student=student, teacher=teacher))
    assert sorted(steps) == list(range(1, 11))
    kl = [steps[s]["rollout/teacher_kl"] for s in sorted(steps)]
    gkd = [steps[s]["train/gkd_loss"] for s in sorted(steps)]
    assert sum(kl[-3:]) < 0.5 * sum(kl[:3]), kl
    assert sum(gkd[-3:]) < sum(gkd[:3]), gkd
    assert not any("distill_share" in k for r in steps.values() for k in r)


TWO = """
app: apps.grpo.main
policy: {{model: {student}}}
steps: 3
max_policy_age: 0
data: {{fn: jsonl, kwargs: {{path: {data}, heldout_size: 2}}}}
teacher:
  key: source
  models:
    letters: {{model: {teacher}}}
    self: {{model: policy, signal: gkd, top_k: 4, replicas: 2}}
rollout: {{prompts_per_step: 4, group_size: 1, max_tokens: 8, tasks: 4, log_episodes: 4}}
generator: {{max_batch_size: 4}}
trainer:
  loss: {{type: grpo}}
  optimizer: {{lr: 1.0e-3}}
eval: {{at_start: false, at_end: false}}
"""


def test_two_teachers_keyed_by_a_data_field(tmp_path):
    student = make_tiny_model(tmp_path / "student", seed=0)
    teacher = letter_teacher(tmp_path / "teacher")
    rows = [
        {"question": f"q{i}", "answer": str(i), "source": ("letters", "self")[i % 2]}
        for i in range(24)
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = _run(tmp_path, TWO.format(student=student, teacher=teacher, data=data))
    assert sorted(steps) == [1, 2, 3]
    seen = {k for r in steps.values() for k in r}
    assert {"rollout/teacher_kl/letters", "rollout/teacher_kl/self"} <= seen
    assert "train/gkd_loss" in seen  # the self teacher's episodes carry top-k targets
    # Self-distillation with no privileged prompt: the teacher is the student's start.
    first = steps[1]
    assert abs(first["rollout/teacher_kl/self"]) < 0.1 < first["rollout/teacher_kl/letters"]
    log = (tmp_path / "run" / "episodes.jsonl").read_text()
    records = [json.loads(x) for x in log.splitlines()]
    assert records and all(
        len(r["distill"]["teacher"]) == len(r["distill"]["student"]) for r in records
    )
