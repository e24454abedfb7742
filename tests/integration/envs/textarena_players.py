"""Scripted textarena opponents for tests/unit/test_textarena.py (import strings)."""

from __future__ import annotations

import re


def lowest_cell(observation: str) -> str:
    """TicTacToe: the lowest-numbered free cell of the newest board it was shown."""
    listed = observation.rsplit("Available Moves:", 1)[1]
    return re.findall(r"\[\d\]", listed)[0]


class AlwaysRock:
    """A textarena-style agent class (built without arguments): always ``[rock]``."""

    def __call__(self, observation: str) -> str:
        return "[rock]"


def _now(coro):
    """The value of a coroutine that never suspends (TextArenaEnv's reset/step)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the coroutine suspended; drive it with an event loop")


class RandomTicTacToeGames:
    """SFT data: TicTacToe transcripts (as TextArenaEnv shows the game to seat 0) in which
    the assistant answers a random free cell as a bare digit, against the random opponent;
    at most ``max_turns`` assistant turns. It teaches the format, not the strategy."""

    def __init__(self, max_turns: int = 3, seed: int = 0):
        import random

        self.max_turns, self.rng = max_turns, random.Random(seed)

    def sample(self) -> dict:
        from forge.integrations.textarena import TextArenaEnv

        env = TextArenaEnv("TicTacToe-v0", seed=self.rng.randrange(10**6))
        obs = _now(env.reset({}))
        messages = [{"role": "user", "content": obs}]
        for _ in range(self.max_turns):
            free = re.findall(r"\[(\d)\]", obs.rsplit("Available Moves:", 1)[1])
            move = self.rng.choice(free)
            messages.append({"role": "assistant", "content": move})
            result = _now(env.step(move))
            if result.done:
                break
            obs = result.observation
            messages.append({"role": "user", "content": obs})
        if messages[-1]["role"] == "user":  # the turn limit cut the game: nothing to learn
            messages.pop()
        return {"messages": messages}

    def heldout(self) -> list[dict]:
        return []
