"""The real-model tasks: add two numbers, asked in chat ("What is 47 + 38?"), and the sparse
one, subtract them ("What is 27 - 82?").

Two data sources (``Addition``, ``Subtraction``) and three reward functions over the same
answer, whatever the operation:

- ``correct``: the response's final number equals the sum (what RL trains on; it is Forge's
  ``math`` reward's rule: the last number, or a ``\\boxed{}`` / ``Answer:`` one).
- ``strict``: the whole response is the number and nothing else (the format asked for).
- ``contains``: the sum appears anywhere in the response as a number (format-blind).

Held-out pairs are drawn from their own seed and never used for training, so held-out accuracy
measures the skill, not memory. Comparing the three at the start and end of a run says how
much of a gain is format (``strict`` rises while ``contains`` stays) and how much is
correctness (``contains`` rises too).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from forge import extract_final_answer

__all__ = ["Addition", "Subtraction", "contains", "correct", "prompt_for", "strict"]

INSTRUCTION = "Answer with just the number."
_NUMBER = re.compile(r"(?<![\d.])-?\d+(?!\d|\.\d)")  # whole numbers; "149." counts


TEXT_PROMPT = "Question: What is {a} plus {b}?\nAnswer:"  # for base models (no chat template)


def prompt_for(a: int, b: int, style: str = "chat") -> list[dict] | str:
    """The prompt for ``a + b``: chat messages, or plain text (``style="text"``) for a base
    model, which answers on the same line (stop at a newline)."""
    if style == "text":
        return TEXT_PROMPT.format(a=a, b=b)
    return [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}]


def _clean(response: str) -> str:
    return response.replace("<|im_end|>", "").strip()


def correct(prompt, response: str, target: str) -> float:
    """1.0 when the response's final answer (``extract_final_answer``) is the sum."""
    answer = extract_final_answer(_clean(response))
    return 1.0 if answer is not None and answer.strip() == str(target) else 0.0


def strict(prompt, response: str, target: str) -> float:
    """1.0 when the response is exactly the sum (a trailing period allowed)."""
    return 1.0 if _clean(response).rstrip(".") == str(target) else 0.0


def contains(prompt, response: str, target: str) -> float:
    """1.0 when the sum appears anywhere in the response as a whole number."""
    return 1.0 if str(target) in _NUMBER.findall(_clean(response)) else 0.0


@dataclass
class Addition:
    """An endless, seeded stream of ``a + b`` questions (``digits``-digit operands) and a
    fixed held-out set of ``heldout_size`` pairs that training never sees."""

    digits: int = 2
    seed: int = 0
    heldout_size: int = 200
    heldout_seed: int = 10_000
    style: str = "chat"  # "text": plain-text prompts, for a base model

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"digits must be 1..9, got {self.digits}")
        if self.style not in ("chat", "text"):
            raise ValueError(f"style must be 'chat' or 'text', got {self.style!r}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        if self.heldout_size > (hi - lo + 1) ** 2 // 2:
            raise ValueError(f"heldout_size={self.heldout_size} leaves too few training pairs")
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
                return self._item(a, b)

    def heldout(self) -> list[dict]:
        return [self._item(a, b) for a, b in self.heldout_pairs]

    def _item(self, a: int, b: int) -> dict:
        """The question about the pair ``(a, b)`` and its answer."""
        return {"prompt": prompt_for(a, b, self.style), "target": str(a + b)}

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))


@dataclass
class Subtraction(Addition):
    """``a - b`` (both ``digits``-digit, drawn independently, so about half the answers are
    negative) over ``Addition``'s pairs and held-out set; chat prompts only.

    The sparse task: SmolLM2-135M-Instruct answers the question's form ("27 - 82 = 1") but
    rarely the right number (greedy held-out about 0.05), so most GRPO groups score all 0 and
    carry no signal, while the same model shown the answer in its prompt repeats it
    (``apps/arith/subtract_distill.yaml``'s privileged teacher)."""

    def __post_init__(self) -> None:
        if self.style != "chat":
            raise ValueError(f"Subtraction asks in chat only; style={self.style!r} is not one")
        super().__post_init__()

    def _item(self, a: int, b: int) -> dict:
        question = f"What is {a} - {b}? {INSTRUCTION}"
        return {"prompt": [{"role": "user", "content": question}], "target": str(a - b)}
