"""The toy task: "what is the sum of the digits of N?", with an exact-match reward.

Numbers have ``digits_min``..``digits_max`` digits. A fixed set of held-out numbers (drawn
from their own seed) is never used for training, so held-out accuracy measures skill, not
memory.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass


def prompt_for(n: int) -> str:
    return f"What is the sum of the digits of {n}? "


def answer_for(n: int) -> str:
    return str(sum(int(d) for d in str(n)))


_INT = re.compile(r"-?\d+")


def parse_answer(response: str) -> str | None:
    """The first integer in the response (the model is taught to answer with just that)."""
    m = _INT.search(response)
    return m.group(0) if m else None


def sumdigits_reward(prompt: str, response: str, target: str) -> float:
    """1.0 for the exact answer, else 0.0."""
    return 1.0 if parse_answer(response) == str(target) else 0.0


@dataclass
class SumDigits:
    """An endless, seeded stream of (prompt, target) pairs plus a held-out set."""

    digits_min: int = 3
    digits_max: int = 4
    seed: int = 0
    heldout_size: int = 200
    heldout_seed: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.digits_min <= self.digits_max:
            raise ValueError(
                f"need 1 <= digits_min <= digits_max, got {self.digits_min}, {self.digits_max}"
            )
        self._rng = random.Random(self.seed)
        hrng = random.Random(self.heldout_seed)
        self.heldout_numbers = [self._draw(hrng) for _ in range(self.heldout_size)]
        self._heldout = set(self.heldout_numbers)

    def _draw(self, rng: random.Random) -> int:
        k = rng.randint(self.digits_min, self.digits_max)
        return rng.randint(10 ** (k - 1), 10**k - 1)

    def sample(self) -> dict:
        while True:
            n = self._draw(self._rng)
            if n not in self._heldout:
                return {"prompt": prompt_for(n), "target": answer_for(n)}

    def heldout(self) -> list[dict]:
        return [{"prompt": prompt_for(n), "target": answer_for(n)} for n in self.heldout_numbers]

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate(state["rng"])
