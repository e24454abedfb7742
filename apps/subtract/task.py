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

from dataclasses import dataclass

from apps.arith.task import Addition

__all__ = ["Subtraction", "prompt_for"]


def prompt_for(a: int, b: int) -> list[dict]:
    """The chat prompt for ``a - b``."""
    return [{"role": "user", "content": f"What is {a} - {b}? Answer with just the number."}]


@dataclass
class Subtraction(Addition):
    """An endless, seeded stream of ``a - b`` questions (both ``digits``-digit, drawn
    independently, so about half the answers are negative) and a fixed held-out set of
    ``heldout_size`` pairs that training never sees (``Addition``'s pairs, another
    question). Chat prompts only."""

    def __post_init__(self) -> None:
        if self.style != "chat":
            raise ValueError(f"Subtraction asks in chat only; style={self.style!r} is not one")
        super().__post_init__()

    def _item(self, a: int, b: int) -> dict:
        return {"prompt": prompt_for(a, b), "target": str(a - b)}
