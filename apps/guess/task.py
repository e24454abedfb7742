"""Guess the number: a multi-turn game with "higher"/"lower" feedback.

The environment hides a number in ``1..n``; each model turn is a guess (the first integer in
its text). It answers ``higher`` or ``lower`` until the guess is right (reward 1, minus
``turn_cost`` per extra turn) or the turn limit ends the episode (reward 0). Binary search
finds any number of 1..8 in at most 4 guesses (1..16: 5).

What was measured with a 0.33M-parameter model on 2 loaded cores (2026-11-23), held-out
greedy success over every secret:

- 1..16, 6 turns, plain feedback, SFT on uniform random guesses: 0.0625, flat for 60 GRPO
  steps (no signal);
- 1..16, 6 turns, plain feedback, SFT on random guesses inside the allowed range:
  0.25 -> 0.625 in 100 steps (0.375 -> 0.625 with a longer SFT);
- 1..16, 6 turns, feedback restating the range (``hint_range``): 0.81 after SFT, then no
  gain in 50 steps (lr 2e-4; lr 6e-4 collapsed);
- 1..8, 4 turns, ``hint_range`` (the shipped config): 0.875 -> 1.0 in 120 steps, 2.75 turns
  on average (binary search: 2.62), 4.3 minutes; sampled success 0.75 -> 0.80.

Plugins of this task (named by import string in ``apps/guess/cpu.yaml``):

- ``GuessNumber``: the environment (``forge.envs.Environment``);
- ``Secrets``: the data source of tasks ``{"secret": k}`` (held out: every number once);
- ``RandomGuessConversations``: SFT data that teaches the format and the rules: the
  assistant guesses uniformly at random among the numbers the feedback still allows;
- ``binary_search``: the optimal policy, the baseline the report compares with.
"""

from __future__ import annotations

import random
import re
from typing import Any

from forge import Environment, StepResult

_INT = re.compile(r"-?\d+")
_MAX_DIGITS = 100


def intro(n: int) -> str:
    return f"Guess my number from 1 to {n}."


def feedback(word: str, low: int, high: int, hint_range: bool) -> str:
    """``higher`` / ``lower``, with the interval still allowed when ``hint_range``."""
    return f"{word} ({low}-{high})" if hint_range else word


def parse_guess(text: str) -> int | None:
    """The first integer in the model's text, or None; None too when that integer has over
    ``_MAX_DIGITS`` digits (no answer here has, and ``int()`` raises ``ValueError`` past
    4,300)."""
    m = _INT.search(text)
    return int(m.group(0)) if m and len(m.group(0)) <= _MAX_DIGITS else None


class GuessNumber(Environment):
    """One episode of the game; ``task`` is ``{"secret": k}``.

    ``hint_range=True`` restates what the feedback so far allows after each answer
    (``higher (9-16)``), so the model need not rebuild the interval from the whole
    conversation; it still has to learn which number to pick in it.
    """

    def __init__(self, n: int = 16, turn_cost: float = 0.05, hint_range: bool = False):
        self.n, self.turn_cost, self.hint_range = n, turn_cost, hint_range
        self.secret = self.turns = 0
        self.low, self.high = 1, n

    async def reset(self, task: dict[str, Any]) -> str:
        self.secret, self.turns = int(task["secret"]), 0
        self.low, self.high = 1, self.n
        if not 1 <= self.secret <= self.n:
            raise ValueError(f"secret {self.secret} is outside 1..{self.n}")
        return intro(self.n)

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        guess = parse_guess(action)
        if guess is None:
            return StepResult(
                "a number, please", info={"invalid": True, "state": (self.low, self.high)}
            )
        if guess == self.secret:
            reward = max(0.0, 1.0 - self.turn_cost * (self.turns - 1))
            return StepResult(
                None,
                reward={"success": 1.0, "efficiency": reward - 1.0},
                done=True,
                info={"success": True, "turns": self.turns},
            )
        if guess < self.secret:
            self.low, word = max(self.low, guess + 1), "higher"
        else:
            self.high, word = min(self.high, guess - 1), "lower"
        # The interval left is the state (the word alone is not): credit over turns
        # (rollout.credit: gigpo) compares guesses made with the same interval left.
        return StepResult(
            feedback(word, self.low, self.high, self.hint_range),
            info={"state": (self.low, self.high)},
        )


class Secrets:
    """Tasks ``{"secret": k}``: training secrets drawn uniformly, held out: 1..n once each."""

    def __init__(self, n: int = 16, seed: int = 0):
        self.n, self.rng = n, random.Random(seed)

    def sample(self) -> dict:
        k = self.rng.randint(1, self.n)
        return {"secret": k, "prompt": intro(self.n), "target": k}

    def heldout(self) -> list[dict]:
        return [{"secret": k, "prompt": intro(self.n), "target": k} for k in range(1, self.n + 1)]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def play(
    policy, secret: int, n: int = 16, max_turns: int = 6, hint_range: bool = False
) -> list[dict]:
    """The chat transcript of ``policy(low, high) -> guess`` playing one game (``low`` and
    ``high`` bound what the feedback so far allows), answered as ``GuessNumber`` answers."""
    messages = [{"role": "user", "content": intro(n)}]
    low, high = 1, n
    for _ in range(max_turns):
        guess = policy(low, high)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            break
        if guess < secret:
            low, word = max(low, guess + 1), "higher"
        else:
            high, word = min(high, guess - 1), "lower"
        messages.append({"role": "user", "content": feedback(word, low, high, hint_range)})
    return messages


def binary_search(low: int, high: int) -> int:
    """The optimal guess: the middle of what is left."""
    return (low + high) // 2


class RandomGuessConversations:
    """SFT data: whole games of random guesses. It teaches the format (a bare number per
    turn) and, with ``consistent=True``, the rules (a guess lies in the interval the feedback
    leaves), not the strategy: each guess is uniform in that interval, so the guesses carry
    no preference for its middle. Sampled, that policy finds the number within 6 turns about
    90% of the time in 3.8 turns (binary search: always, 3.4 turns); greedy decoding of the
    SFT model does much worse. ``consistent=False`` guesses uniformly in 1..n whatever the
    feedback (33% within 6 turns): from there a 0.3M-parameter model learned nothing in 60
    GRPO steps (held-out greedy success flat at 1/16), which is why the demo uses the former.
    """

    def __init__(
        self,
        n: int = 16,
        max_turns: int = 6,
        seed: int = 0,
        consistent: bool = True,
        hint_range: bool = False,
    ):
        self.n, self.max_turns, self.rng = n, max_turns, random.Random(seed)
        self.consistent, self.hint_range = consistent, hint_range

    def _guess(self, low: int, high: int) -> int:
        return self.rng.randint(low, high) if self.consistent else self.rng.randint(1, self.n)

    def sample(self) -> dict:
        secret = self.rng.randint(1, self.n)
        return {"messages": play(self._guess, secret, self.n, self.max_turns, self.hint_range)}

    def heldout(self) -> list[dict]:
        return []


def optimal_success_rate(n: int = 16, max_turns: int = 6) -> tuple[float, float]:
    """``(success rate, mean turns)`` of binary search over every secret of 1..n."""
    turns = []
    for secret in range(1, n + 1):
        msgs = play(binary_search, secret, n, max_turns)
        guesses = [m for m in msgs if m["role"] == "assistant"]
        if int(guesses[-1]["content"]) == secret:
            turns.append(len(guesses))
    return len(turns) / n, sum(turns) / max(1, len(turns))


def random_success_rate(n: int = 16, max_turns: int = 6) -> float:
    """Success rate (exact) of guessing uniformly among the numbers the feedback still
    allows (what ``RandomGuessConversations`` teaches), the secret uniform in 1..n."""
    from functools import lru_cache

    @lru_cache
    def win(size: int, turns: int) -> float:
        if size == 0 or turns == 0:
            return 0.0
        total = 0.0
        for g in range(1, size + 1):  # the guess's rank in the interval left
            below, above = g - 1, size - g
            total += (1 + below * win(below, turns - 1) + above * win(above, turns - 1)) / size
        return total / size

    return win(n, max_turns)
