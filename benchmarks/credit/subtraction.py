"""The subtraction game against a random opponent: a measurement game for credit over turns.

A pile of stones; each turn a player takes 1, 2 or 3; who takes the last stone wins. The
model moves first, then a uniformly random opponent takes a legal number, and so on. The
right move depends on the observation: take ``pile % 4`` (then the pile left is a multiple
of 4, and whatever the opponent takes the model can answer back to a multiple of 4). Every
start pile here is not a multiple of 4, so that rule wins every game; random legal play wins
about half (``random_success_rate``). Only the end is rewarded: 1 for a win, 0 for a loss,
and an illegal move loses at once.

Plugins (named by import string in ``benchmarks/credit/subtraction.yaml``):

- ``Subtraction``: the environment; observations are ``Pile 9.`` (the state: equal piles
  are equal states, so the default state key, the observation text, groups them);
- ``Piles``: tasks ``{"pile": n}`` (held out: every start pile, each twice);
- ``RandomMoveGames``: SFT data of games where the model moves at random (legal moves):
  the format and the rules, not the strategy.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Any

from forge import Environment, StepResult

MOVES = (1, 2, 3)
_INT = re.compile(r"\d+")


def intro(pile: int) -> str:
    return f"Pile {pile}. Take 1, 2 or 3; the last stone wins."


def observe(pile: int) -> str:
    return f"Pile {pile}."


def start_piles(low: int, high: int) -> list[int]:
    """The start piles of ``low..high`` that the optimal rule wins from (not multiples of 4)."""
    return [n for n in range(low, high + 1) if n % 4]


class Subtraction(Environment):
    """One game; ``task`` is ``{"pile": n}``; the opponent is seeded per episode."""

    def __init__(self, seed: int | None = None):
        self.rng = random.Random(seed)
        self.pile = 0

    async def reset(self, task: dict[str, Any]) -> str:
        self.pile = int(task["pile"])
        if self.pile < 1:
            raise ValueError(f"pile {self.pile} must be >= 1")
        return intro(self.pile)

    async def step(self, action: str) -> StepResult:
        m = _INT.search(action)
        take = int(m.group(0)) if m else 0
        if take not in MOVES or take > self.pile:
            return StepResult(None, reward={"success": 0.0}, done=True, info={"illegal": True})
        self.pile -= take
        if self.pile == 0:
            return StepResult(None, reward={"success": 1.0}, done=True)
        self.pile -= self.rng.choice([k for k in MOVES if k <= self.pile])
        if self.pile == 0:
            return StepResult(None, reward={"success": 0.0}, done=True)
        return StepResult(observe(self.pile))


class Piles:
    """Tasks: a start pile drawn uniformly from ``start_piles(low, high)``; held out: each
    start pile ``heldout_repeats`` times (the opponent differs between repeats)."""

    def __init__(self, low: int = 5, high: int = 15, seed: int = 0, heldout_repeats: int = 2):
        self.piles, self.rng = start_piles(low, high), random.Random(seed)
        self.repeats = heldout_repeats

    def sample(self) -> dict:
        pile = self.rng.choice(self.piles)
        return {"pile": pile, "prompt": intro(pile), "target": pile}

    def heldout(self) -> list[dict]:
        return [
            {"pile": p, "prompt": intro(p), "target": p}
            for p in self.piles
            for _ in range(self.repeats)
        ]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def play(policy, pile: int, rng: random.Random) -> tuple[list[dict], bool]:
    """The transcript of ``policy(pile) -> take`` playing one game, and whether it won."""
    messages = [{"role": "user", "content": intro(pile)}]
    while True:
        take = policy(pile)
        messages.append({"role": "assistant", "content": str(take)})
        pile -= take
        if pile == 0:
            return messages, True
        pile -= rng.choice([k for k in MOVES if k <= pile])
        if pile == 0:
            return messages, False
        messages.append({"role": "user", "content": observe(pile)})


class RandomMoveGames:
    """SFT data: whole games in which the model takes a random legal number each turn."""

    def __init__(self, low: int = 5, high: int = 15, seed: int = 0):
        self.piles, self.rng = start_piles(low, high), random.Random(seed)

    def sample(self) -> dict:
        messages, _ = play(
            lambda p: self.rng.choice([k for k in MOVES if k <= p]),
            self.rng.choice(self.piles),
            self.rng,
        )
        return {"messages": messages}

    def heldout(self) -> list[dict]:
        return []


def optimal_move(pile: int) -> int:
    """Leave a multiple of 4 (any legal move when the pile already is one)."""
    return pile % 4 or 1


@lru_cache
def _random_win(pile: int) -> float:
    """P(the model wins) from ``pile`` on its move, both sides random."""
    total = 0.0
    legal = [k for k in MOVES if k <= pile]
    for take in legal:
        left = pile - take
        if left == 0:
            total += 1.0
            continue
        replies = [k for k in MOVES if k <= left]
        total += sum(_random_win(left - r) if left > r else 0.0 for r in replies) / len(replies)
    return total / len(legal)


def random_success_rate(low: int = 5, high: int = 15) -> float:
    """Random legal play's win rate over the start piles (exact)."""
    piles = start_piles(low, high)
    return sum(_random_win(p) for p in piles) / len(piles)
