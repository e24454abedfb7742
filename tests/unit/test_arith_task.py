"""The real-model task's data source and its three scores, by hand."""

from __future__ import annotations

import pytest

from apps.arith.task import Addition, contains, correct, strict


@pytest.mark.parametrize(
    "response,scores",
    [
        ("149", (1, 1, 1)),
        ("149.", (1, 1, 1)),
        ("76 + 73 = 149.", (1, 0, 1)),
        ("The answer is 149, since 76 + 73 = 149", (1, 0, 1)),
        ("149 is wrong; it is 150", (0, 0, 1)),  # right sum present, wrong final answer
        ("76 + 73 equals 159.", (0, 0, 0)),
        ("1149", (0, 0, 0)),
        ("149.5", (0, 0, 0)),
        ("To find 76 + 73, you add them", (0, 0, 0)),
    ],
)
def test_scores(response, scores):
    assert (
        correct(None, response, "149"),
        strict(None, response, "149"),
        contains(None, response, "149"),
    ) == scores


def test_heldout_pairs_never_train_and_the_stream_resumes():
    src = Addition(seed=3, heldout_size=50)
    held = {it["prompt"][0]["content"] for it in src.heldout()}
    assert len(held) == 50
    state = src.state_dict()
    first = [src.sample() for _ in range(300)]
    assert not held & {it["prompt"][0]["content"] for it in first}
    assert all(int(it["target"]) >= 20 for it in first)
    src.load_state_dict(state)
    assert [src.sample() for _ in range(5)] == first[:5]
    assert Addition(seed=3, heldout_size=50).heldout() == src.heldout()  # its own seed


def test_bad_arguments():
    with pytest.raises(ValueError, match="digits"):
        Addition(digits=0)
    with pytest.raises(ValueError, match="heldout_size"):
        Addition(digits=1, heldout_size=60)
