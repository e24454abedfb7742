"""The evaluation harness's arithmetic and checks (pass@k, metrics, sets, checkpoints)."""

from __future__ import annotations

import math

import pytest

from controller import Actor, endpoint
from controller.testing import FakeService
from forge.cli.eval import choose_sets, find_model
from forge.evaluation import EvalSet, pass_at_k
from forge.evaluation.harness import Defaults, _metrics
from forge.run.evaluate import Evaluator
from forge.slots import REWARD
from forge.types import Completion


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k wrong samples: some draw has a right one


def test_metrics_of_samples():
    es = EvalSet("s", n=2, k=[1, 2], success_threshold=1.0)
    per_task = [
        [
            {"components": {"exact": 1.0}, "reward": 1.0, "finish": "stop"},
            {"components": {"exact": 0.0}, "reward": 0.0, "finish": "length"},
        ],
        [
            {"components": {"exact": 0.0}, "reward": 0.0, "finish": "stop"},
            {"components": {"exact": 0.0}, "reward": 0.0, "finish": "stop"},
        ],
    ]
    m = _metrics(es, per_task)
    assert m["tasks"] == 2 and m["samples"] == 4
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["reward"] == pytest.approx(0.25) and m["reward/exact"] == pytest.approx(0.25)
    assert m["finish/stop"] == pytest.approx(0.75) and "turns" not in m
    # A success component decides, whatever the total.
    won = [
        [
            {
                "components": {"success": 1.0, "cost": -0.5},
                "reward": 0.5,
                "finish": "done",
                "turns": 3,
            }
        ]
    ]
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


class _Echo(Actor):
    """A generator stand-in: answers each prompt with its target (or not), counting calls."""

    calls = 0

    @endpoint
    async def generate(self, prompt, n=1, temperature=1.0, max_tokens=8):
        type(self).calls += 1
        text = prompt.split("=")[1] if "3" in prompt else "?"
        return [Completion(prompt, [1], [2], [-0.1], text, "stop", 0) for _ in range(n)]


async def test_sets_that_score_the_runs_own_answers_do_not_generate_again():
    items = [{"prompt": f"q{i}={i}", "target": str(i)} for i in range(5)]
    gen = FakeService([_Echo()])
    log = type("Log", (), {"record": lambda self, step, m: None})()
    sets = [
        EvalSet(name="again", rewards=["exact_match"]),
        EvalSet(name="sampled", rewards=["exact_match"], n=2),
    ]
    ev = Evaluator(
        GroupScorerStub(),
        gen,
        items,
        REWARD.resolve("exact_match"),
        8,
        log,
        sets=sets,
        defaults=Defaults(items, [], None, 8),
    )
    _Echo.calls = 0
    await ev(0)
    assert _Echo.calls == 5 + 5  # the held-out pass, then only the set that samples twice
    assert ev.scores[0] == 0.2


class GroupScorerStub:
    """Not an EpisodeScorer: the evaluation is single-turn."""


def test_which_sets_score_the_runs_greedy_answers():
    from forge.evaluation.harness import scores_run_greedy

    d = Defaults(heldout=[{"prompt": "p", "target": "t"}], rewards=["exact_match"], max_tokens=8)
    assert scores_run_greedy(EvalSet("heldout"), d)
    assert scores_run_greedy(EvalSet("strict", rewards=["exact_match"], limit=2), d)
    assert scores_run_greedy(EvalSet("same", rewards=["exact_match"], max_tokens=8), d)
    assert not scores_run_greedy(EvalSet("longer", rewards=["exact_match"], max_tokens=9), d)
    assert not scores_run_greedy(EvalSet("sampled", rewards=["exact_match"], n=2), d)
    assert not scores_run_greedy(EvalSet("warm", rewards=["exact_match"], temperature=0.5), d)
    other = {"fn": "apps.arith.task:Addition"}
    assert not scores_run_greedy(EvalSet("other", data=other, rewards=["exact_match"]), d)
    # An environment plays episodes: no single greedy answer to reuse.
    assert not scores_run_greedy(EvalSet("heldout"), Defaults(env=object(), max_tokens=8))
