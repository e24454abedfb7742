"""Reward functions with the real math-verify, and their aggregation."""

import pytest

from forge.rewards import (
    ExactMatch,
    LengthPenalty,
    MathReward,
    RewardError,
    RewardResult,
    ThinkingReward,
    evaluate_rewards,
    extract_final_answer,
    length_penalty,
    reward_name,
)
from forge.rewards.math_reward import BadTarget, score_pair

# ---------------------------------------------------------------- answer extraction


@pytest.mark.parametrize(
    "response, expected",
    [
        ("so \\boxed{1} then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{42} and a broken \\boxed{4", "42"),
        ("Work...\nAnswer: 17.\nThanks", "17"),
        ("**Answer:** $x^2$", "x^2"),
        ("I think 3 apples and 1,250 pears", "1250"),
        ("half is 1/2", "1/2"),
        ("<think>maybe \\boxed{5}</think> it is 6", "6"),
        ("no digits here", None),
    ],
)
def test_extract_final_answer(response, expected):
    assert extract_final_answer(response) == expected


# ---------------------------------------------------------------- MathReward's scoring
# MathReward itself scores in a child process: tests/integration/components/test_math_reward.py. Here the
# function that process runs, in this one.


@pytest.mark.parametrize(
    "target, answer, expected",
    [
        ("42", "42", 1.0),
        ("0.5", "1/2", 1.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("1+x^2", "x^2+1", 1.0),
        ("x^2+1", "x^2+2", 0.0),
        ("3000", "3000", 1.0),
        ("42", "}{$$", 0.0),
    ],
)
def test_score_pair(target, answer, expected):
    assert score_pair([target, answer, 2]) == expected


def test_score_pair_names_an_unparseable_target():
    with pytest.raises(BadTarget):
        score_pair(["", "1", 2])


def math_here(prompt, response, target):
    """MathReward's verdict computed in this process (unit tests start no process)."""
    return score_pair([str(target), extract_final_answer(response) or "", 2])


math_here.name = "math"


# ---------------------------------------------------------------- format rewards


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>add them</think>The answer is 4", 1.0),
        ("  \n<think>add them</think>\n4", 1.0),
        ("<think></think>4", 0.5),
        ("<think>add them</think>   ", 0.5),
        ("Sure! <think>add them</think>4", 0.5),
        ("<think>add them 4", 0.0),
        ("add them</think>4", 0.0),
        ("</think>add them<think>4", 0.0),
        ("<think>a</think><think>b</think>4", 0.0),
        ("just 4", 0.0),
    ],
)
def test_thinking_reward(response, expected):
    assert ThinkingReward()("p", response, None) == expected


def test_thinking_reward_when_prompt_opens_think():
    fn = ThinkingReward(prompt_opens_think=True, partial=0.25)
    assert fn("p", "add them</think>4", None) == 1.0
    assert fn("p", "</think>4", None) == 0.25
    assert fn("p", "<think>add them</think>4", None) == 0.0


def test_exact_match():
    assert ExactMatch()("p", "  Paris \n", "Paris") == 1.0
    assert ExactMatch()("p", "paris", "Paris") == 0.0
    assert ExactMatch(ignore_case=True)("p", "paris", "Paris") == 1.0
    gsm = ExactMatch(r"####\s*(.+)")
    assert gsm("p", "#### 12\nso\n#### 18 ", 18) == 1.0
    assert gsm("p", "#### 12", 18) == 0.0
    assert gsm("p", "18", 18) == 0.0  # no match -> 0
    assert ExactMatch(r"\d+")("p", "3 then 7", "7") == 1.0  # no group: whole match


def test_length_penalty():
    assert length_penalty(100, 100, 200) == 0.0
    assert length_penalty(150, 100, 200) == -0.5
    assert length_penalty(175, 100, 200, max_penalty=2.0) == -1.5
    assert length_penalty(10_000, 100, 200) == -1.0
    with pytest.raises(ValueError, match="soft_limit < hard_limit"):
        length_penalty(1, 200, 100)


def test_length_penalty_reward_counts_characters_or_tokens():
    assert LengthPenalty(4, 8)("p", "abcdef", None) == -0.5
    by_words = LengthPenalty(1, 3, count=lambda s: len(s.split()))
    assert by_words("p", "one two three four", None) == -1.0
    with pytest.raises(ValueError):
        LengthPenalty(5, 5)


# ---------------------------------------------------------------- aggregation


def always_one(prompt, response, target):
    return 1.0


def test_reward_names():
    assert reward_name(MathReward()) == "math"
    assert reward_name(always_one) == "always_one"

    class Scorer:
        def __call__(self, prompt, response, target):
            return 0.0

    assert reward_name(Scorer()) == "Scorer"


def test_evaluate_rewards_weighted_sum():
    fns = [math_here, ThinkingReward(), always_one]
    resp = "<think>6 * 7</think>\\boxed{42}"
    result = evaluate_rewards(fns, "p", resp, "42")
    assert result == RewardResult(
        total=3.0, components={"math": 1.0, "thinking_format": 1.0, "always_one": 1.0}
    )
    weighted = evaluate_rewards(fns, "p", "\\boxed{42}", "42", weights=[2.0, 0.5, -1.0])
    assert weighted.total == pytest.approx(2.0 + 0.0 - 1.0)
    by_name = evaluate_rewards(fns, "p", "\\boxed{42}", "42", weights={"math": 3.0})
    assert by_name.total == pytest.approx(3.0 + 0.0 + 1.0)


def test_evaluate_rewards_custom_aggregator():
    def gate(components):
        # format must be right for correctness to count
        return components["math"] * components["thinking_format"]

    fns = [math_here, ThinkingReward()]
    assert evaluate_rewards(fns, "p", "<think>x</think>\\boxed{2}", 2, aggregator=gate).total == 1.0
    result = evaluate_rewards(fns, "p", "\\boxed{2}", 2, aggregator=gate)
    assert result.total == 0.0
    assert result.components == {"math": 1.0, "thinking_format": 0.0}


def test_evaluate_rewards_error_names_the_function():
    def flaky(prompt, response, target):
        raise KeyError("missing field")

    with pytest.raises(RewardError, match="'flaky' raised KeyError") as info:
        evaluate_rewards([always_one, flaky], "p", "r", None)
    assert info.value.reward_name == "flaky"
    assert isinstance(info.value.__cause__, KeyError)


def test_evaluate_rewards_rejects_bad_values_and_arguments():
    with pytest.raises(TypeError, match="'as_text' returned str"):
        evaluate_rewards([_named(lambda p, r, t: "1", "as_text")], "p", "r", None)
    with pytest.raises(ValueError, match="'nan_fn' returned nan"):
        evaluate_rewards([_named(lambda p, r, t: float("nan"), "nan_fn")], "p", "r", None)
    with pytest.raises(ValueError, match="distinct"):
        evaluate_rewards([always_one, always_one], "p", "r", None)
    with pytest.raises(ValueError, match="one weight per function"):
        evaluate_rewards([always_one], "p", "r", None, weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="unknown reward functions"):
        evaluate_rewards([always_one], "p", "r", None, weights={"mathh": 1.0})
    with pytest.raises(ValueError, match="not both"):
        evaluate_rewards([always_one], "p", "r", None, weights=[1.0], aggregator=sum)
    with pytest.raises(ValueError, match="at least one"):
        evaluate_rewards([], "p", "r", None)


def _named(fn, name):
    fn.name = name
    return fn
