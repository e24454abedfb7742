"""Vector rewards: dict-returning reward functions and group aggregators, by hand."""

from __future__ import annotations

import pytest

from forge.rewards.aggregate import RewardResult, evaluate_rewards
from forge.rewards.vector import (
    AGGREGATORS,
    build_aggregator,
    component_means,
    minimum,
    pareto_fronts,
    pareto_rank,
    weighted_sum,
)


def _group(points, names=("a", "b")):
    return [dict(zip(names, p)) for p in points]


# ---------------------------------------------------------------- Pareto fronts


def test_pareto_fronts_2d_three_fronts():
    # Five points, both coordinates "higher is better":
    #
    #   b
    #   4 | P1
    #   3 | P3
    #   2 |
    #   1 |          P0
    #   0 | P4       P2
    #     +---------------- a
    #       0  1  2  3  4
    #
    #   P0 = (4, 1)  dominated by nobody                          -> front 0
    #   P1 = (1, 4)  dominated by nobody                          -> front 0
    #   P2 = (4, 0)  dominated by P0 (4 >= 4 and 1 > 0)           -> front 1
    #   P3 = (0, 3)  dominated by P1 (1 > 0 and 4 > 3)            -> front 1
    #   P4 = (0, 0)  left once fronts 0 and 1 are gone            -> front 2
    #                (P2 vs P3: neither dominates the other)
    # F = 3 fronts, scalar = (F - 1 - front) / (F - 1): 1.0, 0.5, 0.0.
    points = {"P0": (4, 1), "P1": (1, 4), "P2": (4, 0), "P3": (0, 3), "P4": (0, 0)}
    order = ["P2", "P0", "P4", "P1", "P3"]  # shuffled: the result follows input order
    assert pareto_fronts([points[k] for k in order]) == [1, 0, 2, 0, 1]
    rewards = pareto_rank()(_group([points[k] for k in order]))
    assert rewards == [0.5, 1.0, 0.0, 1.0, 0.5]


def test_pareto_fronts_3d():
    # Q0, Q1, Q2: each is best on a different pair of axes, none dominates another -> front 0.
    # Q3 = (1, 0, 0) is dominated by Q0 and Q2; Q5 = (0, 1, 0) by Q0 and Q1; Q3 and Q5 are
    # incomparable -> front 1. Q4 = (0, 0, 0) is dominated by Q3 and Q5 -> front 2.
    points = [(1, 1, 0), (0, 1, 1), (1, 0, 1), (1, 0, 0), (0, 0, 0), (0, 1, 0)]
    assert pareto_fronts(points) == [0, 0, 0, 1, 2, 1]
    assert pareto_rank()(_group(points, "xyz")) == [1.0, 1.0, 1.0, 0.5, 0.0, 0.5]


def test_pareto_four_fronts_in_a_chain():
    # (3,3) > (2,2) > (1,1) > (0,0): F = 4 -> 1, 2/3, 1/3, 0.
    rewards = pareto_rank()(_group([(1, 1), (3, 3), (0, 0), (2, 2)]))
    assert rewards == pytest.approx([1 / 3, 1.0, 0.0, 2 / 3])


def test_pareto_equal_points_share_a_front():
    # Equal points do not dominate each other (no strictly better component).
    assert pareto_fronts([(1, 1), (1, 1), (0, 2)]) == [0, 0, 0]
    assert pareto_rank()(_group([(1, 1), (1, 1), (0, 2)])) == [1.0, 1.0, 1.0]
    assert pareto_fronts([(1, 1), (0, 0), (1, 1), (0, 0)]) == [0, 1, 0, 1]
    assert pareto_rank()(_group([(1, 1), (0, 0), (1, 1), (0, 0)])) == [1.0, 0.0, 1.0, 0.0]


def test_pareto_dominance_needs_ge_everywhere_and_gt_somewhere():
    assert pareto_fronts([(2, 1), (2, 0)]) == [0, 1]  # equal a, better b: dominates
    assert pareto_fronts([(2, 0), (1, 5)]) == [0, 0]  # better a, worse b: incomparable
    assert pareto_fronts([(5, 5, 0), (4, 4, 1)]) == [0, 0]  # one worse axis is enough


def test_pareto_single_front_small_and_empty_groups():
    assert pareto_rank()(_group([(0.3, 0.7)])) == [1.0]
    assert pareto_rank()(_group([(1, 0), (0, 1)])) == [1.0, 1.0]
    assert pareto_rank()([]) == []
    assert pareto_fronts([]) == []
    # one component: fronts are the distinct values, best first
    assert pareto_rank()([{"a": 0.0}, {"a": 2.0}, {"a": 1.0}, {"a": 2.0}]) == [
        0.0,
        1.0,
        0.5,
        1.0,
    ]


# ---------------------------------------------------------------- weighted sum and min


def test_weighted_sum():
    group = [{"a": 1.0, "b": 2.0}, {"a": -1.0, "b": 0.5}]
    assert weighted_sum()(group) == [3.0, -0.5]
    assert weighted_sum({"a": 2.0})(group) == [4.0, -1.5]  # b weighs 1.0
    assert weighted_sum({"a": 0.5, "b": -2.0})(group) == [-3.5, -1.5]
    assert weighted_sum({"a": 1.0})([]) == []


def test_weighted_sum_unknown_weight_lists_known_components():
    with pytest.raises(ValueError, match=r"unknown components \['c'\].*\['a', 'b'\]"):
        weighted_sum({"c": 1.0})([{"a": 1.0, "b": 2.0}])


def test_minimum():
    group = [{"a": 1.0, "b": 2.0}, {"a": -1.0, "b": 0.5}, {"a": 0.0, "b": 0.0}]
    assert minimum()(group) == [1.0, -1.0, 0.0]


def test_group_members_must_share_components():
    group = [{"a": 1.0, "b": 2.0}, {"a": 1.0}]
    for agg in (weighted_sum(), minimum(), pareto_rank()):
        with pytest.raises(ValueError, match=r"member 1 .*missing \['b'\]"):
            agg(group)
    with pytest.raises(ValueError, match="at least one"):
        minimum()([{}, {}])
    with pytest.raises(ValueError, match="'b' = nan"):
        pareto_rank()([{"a": 1.0, "b": float("nan")}])


# ---------------------------------------------------------------- factory and helpers


def test_build_aggregator():
    group = [{"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 0.0}]
    assert set(AGGREGATORS) == {"weighted_sum", "min", "pareto"}
    assert build_aggregator("weighted_sum", weights={"b": 0.5})(group) == [2.5, 2.0]
    assert build_aggregator("min")(group) == [1.0, 0.0]
    assert build_aggregator("pareto")(group) == [1.0, 1.0]

    def first(components_g):
        return [c["a"] for c in components_g]

    assert build_aggregator(first) is first
    with pytest.raises(ValueError, match=r"unknown aggregator type: 'max'.*'min', 'pareto'"):
        build_aggregator("max")
    with pytest.raises(ValueError, match="bind them into the callable"):
        build_aggregator(first, weights={"a": 1.0})
    with pytest.raises(TypeError, match="name or a callable"):
        build_aggregator(3)


def test_component_means():
    comps = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 2.0, "b": 2.0, "c": 5.0}]
    assert component_means(comps) == {"a": 1.0, "b": 1.0, "c": 5.0}
    assert component_means([]) == {}


# ---------------------------------------------------------------- dict rewards in evaluate_rewards


def always_one(prompt, response, target):
    return 1.0


def judge(prompt, response, target):
    return {"correct": float(response == target), "short": -0.5}


def _named(fn, name):
    fn.name = name
    return fn


def test_vector_reward_components_are_flattened():
    result = evaluate_rewards([always_one, judge], "p", "4", "4")
    assert result == RewardResult(
        total=1.5, components={"always_one": 1.0, "correct": 1.0, "short": -0.5}
    )
    # one weight per function: judge's weight applies to both of its components
    assert evaluate_rewards([always_one, judge], "p", "4", "4", weights=[2.0, 3.0]).total == 3.5
    # by name: a component's own weight wins over its function's
    by_name = evaluate_rewards(
        [always_one, judge], "p", "4", "4", weights={"judge": 2.0, "short": 1.0}
    )
    assert by_name.total == 1.0 + 2.0 * 1.0 + 1.0 * -0.5
    with pytest.raises(ValueError, match=r"unknown reward functions or components \['shrt'\]"):
        evaluate_rewards([always_one, judge], "p", "4", "4", weights={"shrt": 1.0})


def test_vector_reward_custom_aggregator_sees_every_component():
    def gate(components):
        return components["correct"] * components["always_one"]

    result = evaluate_rewards([always_one, judge], "p", "4", "5", aggregator=gate)
    assert result.total == 0.0
    assert result.components == {"always_one": 1.0, "correct": 0.0, "short": -0.5}


def test_vector_reward_may_use_its_own_name_as_a_key():
    vec = _named(lambda p, r, t: {"style": 0.5, "style_len": 1.0}, "style")
    assert evaluate_rewards([vec], "p", "r", None).components == {"style": 0.5, "style_len": 1.0}


def test_vector_reward_collisions_name_both_functions():
    clash_name = _named(lambda p, r, t: {"always_one": 0.0}, "clash")
    with pytest.raises(ValueError, match="'clash' returned component 'always_one'.*'always_one'"):
        evaluate_rewards([always_one, clash_name], "p", "r", None)
    # a key equal to the name of a function later in the list collides too
    with pytest.raises(ValueError, match="'clash' returned component 'always_one'"):
        evaluate_rewards([clash_name, always_one], "p", "r", None)
    other = _named(lambda p, r, t: {"correct": 1.0}, "other_judge")
    with pytest.raises(ValueError, match="'other_judge' returned component 'correct'.*'judge'"):
        evaluate_rewards([judge, other], "p", "r", None)


@pytest.mark.parametrize(
    "value, error, match",
    [
        ({"ok": 1.0, "bad": "yes"}, TypeError, "'vec' returned for 'bad' str 'yes'"),
        ({"bad": None}, TypeError, "'vec' returned for 'bad' NoneType"),
        ({"bad": float("nan")}, ValueError, "'vec' returned for 'bad' nan; rewards must be finite"),
        ({"bad": float("-inf")}, ValueError, "'vec' returned for 'bad' -inf"),
        ({}, ValueError, "'vec' returned an empty dict"),
        ({3: 1.0}, TypeError, "'vec' returned a dict with key 3"),
        ({"": 1.0}, TypeError, "non-empty strings"),
    ],
)
def test_vector_reward_bad_values(value, error, match):
    vec = _named(lambda p, r, t: value, "vec")
    with pytest.raises(error, match=match):
        evaluate_rewards([always_one, vec], "p", "r", None)


def test_weight_count_is_checked_before_scoring():
    calls = []

    def counted(prompt, response, target):
        calls.append(1)
        return {"x": 1.0}

    with pytest.raises(ValueError, match="one weight per function"):
        evaluate_rewards([counted], "p", "r", None, weights=[1.0, 2.0])
    assert calls == []


def test_group_of_vector_results_through_an_aggregator():
    # End to end: score a group of G=3 responses, then aggregate their components.
    group = [evaluate_rewards([judge], "p", r, "4") for r in ("4", "5", "4")]
    comps = [r.components for r in group]
    assert comps == [{"correct": 1.0, "short": -0.5}, {"correct": 0.0, "short": -0.5}] + [
        {"correct": 1.0, "short": -0.5}
    ]
    assert build_aggregator("pareto")(comps) == [1.0, 0.0, 1.0]
    assert build_aggregator("min")(comps) == [-0.5, -0.5, -0.5]
    assert component_means(comps) == {"correct": 2 / 3, "short": -0.5}
