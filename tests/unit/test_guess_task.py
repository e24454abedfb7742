"""The guess-the-number task's pieces, without processes."""

from __future__ import annotations

from apps.guess.task import (
    GuessNumber,
    RandomGuessConversations,
    Secrets,
    binary_search,
    optimal_success_rate,
    play,
)


async def test_the_game():
    env = GuessNumber(n=16, turn_cost=0.05)
    assert "1 to 16" in await env.reset({"secret": 11})
    assert (await env.step("8")).observation == "higher"
    assert (await env.step("I say 14")).observation == "lower"
    assert (await env.step("no idea")).observation == "a number, please"
    win = await env.step("11")
    assert win.done and win.reward == {"success": 1.0, "efficiency": -0.05 * 3}


def test_binary_search_is_optimal_and_the_baseline_is_random():
    assert optimal_success_rate(16, 6) == (1.0, 3.375)
    assert optimal_success_rate(16, 4)[0] < 1.0  # 16 numbers need 5 halvings at worst
    msgs = play(binary_search, 16, 16, 6)
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == ["8", "12", "14", "15", "16"]
    data = RandomGuessConversations(n=16, max_turns=6, seed=0)
    for _ in range(50):  # every guess respects the feedback so far
        lo, hi = 1, 16
        turns = data.sample()["messages"][1:]
        for guess_msg, reply in zip(turns[::2], [*turns[1::2], None]):
            g = int(guess_msg["content"])
            assert lo <= g <= hi
            if reply is not None:
                lo, hi = (g + 1, hi) if reply["content"] == "higher" else (lo, g - 1)


def test_secrets():
    s = Secrets(n=16, seed=3)
    assert [t["secret"] for t in s.heldout()] == list(range(1, 17))
    state = s.state_dict()
    a = [s.sample()["secret"] for _ in range(5)]
    s.load_state_dict(state)
    assert [s.sample()["secret"] for _ in range(5)] == a
