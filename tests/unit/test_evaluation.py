"""The evaluation harness's arithmetic and checks (pass@k, metrics, sets, checkpoints)."""

from __future__ import annotations

import math

import pytest

from forge.evaluation import EvalSet, pass_at_k
from forge.evaluation.command import choose_sets, find_model
from forge.evaluation.harness import _metrics


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k wrong samples: some draw has a right one


def test_metrics_of_samples():
    es = EvalSet("s", n=2, k=[1, 2], success_threshold=1.0)
    per_task = [
        [{"components": {"exact": 1.0}, "reward": 1.0, "finish": "stop"},
         {"components": {"exact": 0.0}, "reward": 0.0, "finish": "length"}],
        [{"components": {"exact": 0.0}, "reward": 0.0, "finish": "stop"},
         {"components": {"exact": 0.0}, "reward": 0.0, "finish": "stop"}],
    ]  # fmt: skip
    m = _metrics(es, per_task)
    assert m["tasks"] == 2 and m["samples"] == 4
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["reward"] == pytest.approx(0.25) and m["reward/exact"] == pytest.approx(0.25)
    assert m["finish/stop"] == pytest.approx(0.75) and "turns" not in m
    # A success component decides, whatever the total.
    won = [[{"components": {"success": 1.0, "cost": -0.5}, "reward": 0.5, "finish": "done",
             "turns": 3}]]  # fmt: skip
    assert (
        _metrics(EvalSet("w"), won)["pass@1"] == 1.0 and _metrics(EvalSet("w"), won)["turns"] == 3
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "a/b"}, "without '/'"),
        ({"name": "a", "n": 2, "k": [4]}, r"k=\[4\] outside 1..n=2"),
        ({"name": "a", "rewards": ["exact_match"], "env": object()}, "not both"),
        ({"name": "a", "rewards": ["nope"]}, r"eval.sets\[a\].rewards\[0\]"),
    ],
)
def test_bad_sets_are_named(kwargs, error):
    with pytest.raises(ValueError, match=error):
        EvalSet(**kwargs)


def test_sets_and_checkpoints_are_found_or_named(tmp_path):
    from forge.launch import load_app
    from tests.helpers import REPO

    _, cfg = load_app(REPO / "apps/guess/cpu.yaml", ["rl.eval.sets=[{name: wide, n: 2}]"])
    assert [s.name for s in choose_sets(cfg.rl, None)] == ["heldout", "wide"]
    assert [s.name for s in choose_sets(cfg.rl, "wide")] == ["wide"]
    with pytest.raises(ValueError, match=r"no such eval set; the config has \['heldout', 'wide'\]"):
        choose_sets(cfg.rl, "wide,narrow")
    with pytest.raises(ValueError, match="names must be unique"):
        load_app(REPO / "apps/guess/cpu.yaml", ["rl.eval.sets=[{name: a}, {name: a}]"])
    (tmp_path / "rl" / "model").mkdir(parents=True)
    (tmp_path / "rl" / "model" / "config.json").write_text("{}")
    assert find_model(tmp_path) == tmp_path / "rl" / "model"
    with pytest.raises(ValueError, match="no model there"):
        find_model(tmp_path / "rl" / "model" / "x")
