"""The subtraction game's exact values (``benchmarks/credit/exact_advantages.py``), checked
against what is known in closed form: the optimal rule wins every game, random legal play
wins ``random_success_rate()``, and "take 1 until you can finish" wins 0.904."""

from __future__ import annotations

import pytest

from benchmarks.credit.exact_advantages import exact_q, greedy_success
from benchmarks.credit.subtraction import MOVES, optimal_move, random_success_rate, start_piles

STATES = [(p, True) for p in start_piles(5, 15)] + [(p, False) for p in range(1, 16)]


def _policy(move_of) -> dict:
    return {s: [float(k == move_of(s[0])) for k in MOVES] for s in STATES}


def test_the_optimal_rule_wins_every_game():
    q = exact_q(_policy(optimal_move))
    assert all(q[(p, True)][-1] == 1.0 for p in start_piles(5, 15))
    assert greedy_success(_policy(optimal_move)) == 1.0
    # From a multiple of 4 every move loses against perfect play, not against a random one.
    assert 0 < q[(8, False)][-1] < 1


def test_uniform_play_matches_the_closed_form():
    uniform = {s: [1 / min(3, s[0]) if k <= s[0] else 0.0 for k in MOVES] for s in STATES}
    q = exact_q(uniform)
    piles = start_piles(5, 15)
    assert sum(q[(p, True)][-1] for p in piles) / len(piles) == pytest.approx(random_success_rate())


def test_advantages_at_hand_checked_states():
    """Under "take 1 until you can finish": V(4) = 2/3 (the opponent wins only by taking 3),
    Q(7, take 3) = 1 (leaves 4), Q(7, take 1) = (V(5) + V(4) + V(3)) / 3 = 8/9; illegal = 0."""
    q = exact_q(_policy(lambda pile: pile if pile <= 3 else 1))
    assert q[(4, False)][-1] == pytest.approx(2 / 3)
    assert q[(7, False)][3] == pytest.approx(1.0)
    assert q[(7, False)][1] == pytest.approx(8 / 9)
    assert q[(7, False)][0] == 0.0 and q[(2, False)][3] == 0.0
    assert greedy_success(_policy(lambda pile: pile if pile <= 3 else 1)) == pytest.approx(
        0.904, abs=5e-4
    )


def test_whole_prompt_games_follow_the_rules():
    """``whole_prompts.play``'s games (uniform legal moves here): every conversation holds
    the game so far, and they win as often as random play does."""
    import random

    from benchmarks.credit.whole_prompts import play, won

    piles = [p for p in start_piles(5, 15) for _ in range(400)]
    games = play(None, piles, random.Random(0), "random")
    for pile, turns in zip(piles[:50], games):
        assert turns[0][0] == [{"role": "user", "content": turns[0][0][0]["content"]}]
        assert turns[0][1] == (pile, True)
        for k, (msgs, (p, first), take) in enumerate(turns):
            assert len(msgs) == 1 + 2 * k and first == (k == 0) and 1 <= take <= min(3, p)
            assert k == 0 or msgs[-1]["content"] == f"Pile {p}."
    share = sum(map(won, games)) / len(games)
    assert share == pytest.approx(random_success_rate(), abs=0.03)
