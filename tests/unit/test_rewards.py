"""Reward functions with the real math-verify, and their aggregation."""

import threading

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


# ---------------------------------------------------------------- MathReward


MATH = MathReward()


@pytest.mark.parametrize(
    "response, target, expected",
    [
        ("The answer is \\boxed{42}", "42", 1.0),
        ("\\boxed{42}", 42, 1.0),
        ("The answer is \\boxed{43}", "42", 0.0),
        ("Answer: 1/2", "0.5", 1.0),
        ("so x = \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("Answer: $\\frac{2}{4}$", "1/2", 1.0),
        ("\\boxed{x^2+1}", "1+x^2", 1.0),
        ("\\boxed{x^2+2}", "x^2+1", 0.0),
        ("We get 3,000 in total", "3000", 1.0),
        ("first 7, then finally 8", "7", 0.0),
        ("<think>\\boxed{3}</think>\\boxed{4}", "4", 1.0),
        ("<think>\\boxed{4}</think>\\boxed{3}", "4", 0.0),
    ],
)
def test_math_reward(response, target, expected):
    assert MATH("prompt", response, target) == expected


@pytest.mark.parametrize("response", ["", "no answer at all", "\\boxed{", "\\boxed{}", "}{$$"])
def test_math_reward_malformed_response_scores_zero(response):
    assert MATH("p", response, "42") == 0.0


def test_math_reward_overlong_answer_is_not_parsed():
    assert MathReward(max_answer_chars=5)("p", "\\boxed{1+1+1+1}", "4") == 0.0
    assert MathReward()("p", "\\boxed{1+1+1+1}", "4") == 1.0


def test_math_reward_unparseable_target_raises():
    with pytest.raises(ValueError, match="cannot parse the target"):
        MATH("p", "\\boxed{1}", "")


def test_math_reward_works_in_worker_threads():
    # math-verify's default signal-based timeout raises outside the main thread.
    results: dict[int, float] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = MATH("p", f"Answer: \\boxed{{{i}/2}}", str(i / 2))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}


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
    fns = [MathReward(), ThinkingReward(), always_one]
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

    fns = [MathReward(), ThinkingReward()]
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
