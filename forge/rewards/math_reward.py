"""``MathReward``: 1.0 when the response's final answer equals the target mathematically.

Equality is decided by Hugging Face's math-verify (``1/2`` == ``0.5`` == ``\\frac{1}{2}``,
``3,000`` == ``3000``, sets, intervals, simple symbolic expressions).

Thread safety: math-verify's default timeouts use ``signal.alarm``, which only works in the
main thread, and reward functions run in worker threads, so every call passes
``parsing_timeout=None`` / ``timeout_seconds=None``. In exchange, answers longer than
``max_answer_chars`` are scored 0 without being parsed, to bound sympy's work.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MathReward", "extract_final_answer"]

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_RE = re.compile(r"answer\s*(?:is)?\s*\**\s*[:：]\s*([^\n]+)", re.IGNORECASE)
# A number with thousands separators, or a plain integer / decimal / simple fraction.
_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (braces balanced), or None."""
    for m in reversed(list(_BOXED_RE.finditer(text))):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end() : i - 1]
    return None


def extract_final_answer(response: str) -> str | None:
    """The response's final answer as text, or None when it has none.

    Only the text after the last ``</think>`` is searched, when there is one. Preference:
    the last complete ``\\boxed{...}``; else the last ``Answer: ...`` line (markdown bold,
    ``$`` and a trailing period stripped); else the last number.
    """
    text = response.rsplit("</think>", 1)[-1]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    lines = _ANSWER_RE.findall(text)
    if lines:
        answer = lines[-1].strip().strip("*$ ").rstrip(".").strip("*$ ")
        if answer:
            return answer
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return numbers[-1].replace(",", "")
    return None


class MathReward:
    """``(prompt, response, target) -> 1.0 | 0.0``: is the final answer equal to ``target``?

    ``target`` is a string or number, plain (``"0.5"``, ``"x^2+1"``) or LaTeX (``"\\frac12"``
    or with its own ``$...$`` / ``\\boxed{}``). A target math-verify cannot parse raises
    ``ValueError`` (a dataset bug that would otherwise score every response 0); a response
    without a parseable answer scores 0.
    """

    def __init__(self, name: str = "math", max_answer_chars: int = 1000) -> None:
        self.name = name
        self.max_answer_chars = max_answer_chars

    @staticmethod
    def _parse(text: str) -> list:
        from math_verify import parse  # lazy: imports sympy and the LaTeX grammar

        # Plain text goes inside \boxed{} so math-verify reads it as one LaTeX expression
        # (unwrapped, "x^2+1" does not parse at all and "1,2" reads as 1.2).
        if "\\boxed" not in text and "$" not in text:
            text = f"\\boxed{{{text}}}"
        return parse(text, parsing_timeout=None)

    def __call__(self, prompt: str, response: str, target: Any) -> float:
        from math_verify import verify

        if target is None:
            raise ValueError(
                "math: the item has no target answer; give the data a target field "
                "(data kwargs target_field=...)"
            )
        gold = self._parse(str(target).strip())
        if not gold:
            raise ValueError(f"math-verify cannot parse the target {target!r}")
        answer = extract_final_answer(response)
        if answer is None or len(answer) > self.max_answer_chars:
            return 0.0
        pred = self._parse(answer)
        if not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0
