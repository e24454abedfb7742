"""MathReward end to end: answers scored in its time-bounded child process (see
tests/integration/hostile/test_reward_bombs.py for answers that never finish scoring)."""

import threading

import pytest

from forge.rewards import MathReward

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


def test_score_batch_is_one_call_per_answer_in_one_trip():
    items = [("p", f"\\boxed{{{i}}}", str(i if i % 3 else i + 1)) for i in range(12)]
    assert MATH.score_batch(items) == [MATH(*it) for it in items]
    assert MATH.score_batch([]) == []
    with pytest.raises(ValueError, match="no target answer"):
        MATH.score_batch([("p", "\\boxed{1}", None)])


def test_a_used_math_reward_pickles_without_its_processes():
    import pickle

    MATH("p", "\\boxed{1}", "1")  # its scoring process is running
    copy = pickle.loads(pickle.dumps(MATH))
    try:
        assert copy._scorer is None and copy("p", "\\boxed{2}", "2") == 1.0
    finally:
        copy.close()


@pytest.fixture(autouse=True, scope="module")
def _close_math():
    yield
    MATH.close()
