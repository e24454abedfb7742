"""A sparse real-model task: subtract two 2-digit numbers, asked in chat ("What is 27 - 82?").

Half the answers are negative. SmolLM2-135M-Instruct answers the question's form ("27 - 82 =
1") but rarely the right number: its greedy held-out accuracy is about 0.05, so most GRPO
groups score all 0 and carry no signal, while the same model shown the answer in its prompt
repeats it (``apps/subtract/distill.yaml``'s privileged teacher). The rewards are the addition
task's (``apps.arith.task``: ``correct``, ``strict``, ``contains``), which compare the response
with ``target``, whatever the operation.

Held-out pairs are drawn from their own seed and never used for training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Subtraction", "prompt_for"]


def prompt_for(a: int, b: int) -> list[dict]:
    """The chat prompt for ``a - b``."""
    return [{"role": "user", "content": f"What is {a} - {b}? Answer with just the number."}]


@dataclass
class Subtraction:
    """An endless, seeded stream of ``a - b`` questions (both ``digits``-digit, drawn
    independently, so about half the answers are negative) and a fixed held-out set of
    ``heldout_size`` pairs that training never sees."""

    digits: int = 2
    seed: int = 0
    heldout_size: int = 200
    heldout_seed: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"digits must be 1..9, got {self.digits}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        if self.heldout_size > (hi - lo + 1) ** 2 // 2:
            raise ValueError(
                f"heldout_size={self.heldout_size} leaves too few training pairs for "
                f"digits={self.digits}; lower heldout_size or raise digits"
            )
        self._range, self._rng = (lo, hi), random.Random(self.seed)
        hrng, held = random.Random(self.heldout_seed), []
        seen: set[tuple[int, int]] = set()
        while len(held) < self.heldout_size:
            pair = self._draw(hrng)
            if pair not in seen:
                seen.add(pair)
                held.append(pair)
        self.heldout_pairs, self._held = held, seen

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(*self._range), rng.randint(*self._range)

    def sample(self) -> dict:
        while True:
            a, b = self._draw(self._rng)
            if (a, b) not in self._held:
                return {"prompt": prompt_for(a, b), "target": str(a - b)}

    def heldout(self) -> list[dict]:
        return [{"prompt": prompt_for(a, b), "target": str(a - b)} for a, b in self.heldout_pairs]

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
