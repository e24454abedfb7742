"""The sparse subtraction task: its stream, its held-out set, and how the shared rewards score
negative differences."""

from __future__ import annotations

import re

import pytest

from apps.arith.task import Subtraction, contains, correct, strict

_Q = re.compile(r"What is (\d+) - (\d+)\?")


def _pair(item: dict) -> tuple[int, int]:
    a, b = _Q.match(item["prompt"][0]["content"]).groups()
    return int(a), int(b)


@pytest.mark.parametrize(
    "response,scores",
    [
        ("-55", (1, 1, 1)),
        ("27 - 82 = -55.", (1, 0, 1)),
        ("27-82=-55", (1, 0, 1)),
        ("55", (0, 0, 0)),  # the magnitude without the sign is wrong
        ("27 - 82 = 55", (0, 0, 0)),
        ("-55 is wrong; it is -54", (0, 0, 1)),
        ("-555", (0, 0, 0)),
    ],
)
def test_negative_answers_are_scored_with_their_sign(response, scores):
    assert (
        correct(None, response, "-55"),
        strict(None, response, "-55"),
        contains(None, response, "-55"),
    ) == scores


def test_targets_are_the_differences_and_heldout_pairs_never_train():
    src = Subtraction(seed=3, heldout_size=50)
    held = [_pair(it) for it in src.heldout()]
    assert len(set(held)) == 50
    assert all(it["target"] == str(a - b) for it, (a, b) in zip(src.heldout(), held))
    state = src.state_dict()
    first = [src.sample() for _ in range(400)]
    pairs = [_pair(it) for it in first]
    assert not set(held) & set(pairs)
    assert all(it["target"] == str(a - b) for it, (a, b) in zip(first, pairs))
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, b in pairs)
    negative = sum(a < b for a, b in pairs) / len(pairs)
    assert 0.4 < negative < 0.6  # about half the answers are negative
    src.load_state_dict(state)
    assert [src.sample() for _ in range(5)] == first[:5]
    assert Subtraction(seed=3, heldout_size=50).heldout() == src.heldout()  # its own seed


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="digits"):
        Subtraction(digits=0)
    with pytest.raises(ValueError, match="heldout_size"):
        Subtraction(digits=1, heldout_size=60)
