"""``MathReward``: 1.0 when the response's final answer equals the target mathematically.

Equality is decided by Hugging Face's math-verify (``1/2`` == ``0.5`` == ``\\frac{1}{2}``,
``3,000`` == ``3000``, sets, intervals, simple symbolic expressions).

Time bound: one answer can keep sympy busy for ever (``\\boxed{9^{9^{9^{9}}}}`` computes the
power), inside C code that neither math-verify's ``signal.alarm`` timeouts nor a thread can
interrupt. So answers are scored in a child process (``forge.rewards.bounded``), a batch at
a time: an answer not scored within ``timeout_s`` gets its child killed and scores 0 (with a
warning naming it), and the run goes on. In the child, math-verify's own alarm timeouts (it
runs them in its main thread) stop the slow-but-interruptible cases first, without a kill;
its log lines stay there. Answers longer than ``max_answer_chars`` score 0 unparsed.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

__all__ = ["MathReward", "extract_final_answer", "score_pair"]

logger = logging.getLogger("forge.rewards")

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"[{}]")
# "answer", an optional "is", optional bold stars, a colon, then the rest of the line. Written
# so that no two ``\s*`` meet: ``answer\s*(?:is)?\s*\**\s*[:：]`` reads the same texts but,
# when no colon follows, tries every three-way split of a long whitespace run.
_ANSWER_RE = re.compile(r"answer\s*(?:is\s*)?(?:\*+\s*)?[:：]\s*([^\n]+)", re.IGNORECASE)
# A number with thousands separators, or a plain integer / decimal / simple fraction.
_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (braces balanced), or None.

    One pass pairs every brace with its match, so many unclosed boxes are read once, not
    once per box.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    closes: dict[int, int] = {}  # just after an opening brace -> where its closing brace is
    opened: list[int] = []
    for m in _BRACE_RE.finditer(text):
        if m.group() == "{":
            opened.append(m.end())
        elif opened:
            closes[opened.pop()] = m.start()
    for start in reversed(starts):
        if start in closes:
            return text[start : closes[start]]
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
    without a parseable answer scores 0, and so does one not scored within ``timeout_s``
    seconds (see the module docstring). ``score_batch`` scores many in one trip to the
    scoring process (``RewardActor.evaluate_batch`` uses it); ``workers`` such processes
    serve concurrent callers, each limited to ``max_memory_mb`` of address space.
    """

    def __init__(
        self,
        name: str = "math",
        max_answer_chars: int = 1000,
        timeout_s: float = 5.0,
        workers: int = 1,
        max_memory_mb: int = 4096,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"math: timeout_s must be > 0, got {timeout_s}")
        self.name = name
        self.max_answer_chars = max_answer_chars
        self.timeout_s, self.workers, self.max_memory_mb = timeout_s, workers, max_memory_mb
        self._scorer = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # Travels to reward actors without its processes; they start where it is used.
        return {k: v for k, v in self.__dict__.items() if k not in ("_scorer", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._scorer, self._lock = None, threading.Lock()

    def _bounded(self):
        from forge.rewards.bounded import BoundedScorer

        with self._lock:
            if self._scorer is None:
                self._scorer = BoundedScorer(
                    f"{__name__}:score_pair",
                    timeout_s=self.timeout_s,
                    workers=self.workers,
                    max_memory_mb=self.max_memory_mb,
                )
            return self._scorer

    def close(self) -> None:
        """Stop the scoring processes (a later call starts new ones)."""
        if self._scorer is not None:
            self._scorer.close()

    def __call__(self, prompt: str, response: str, target: Any) -> float:
        return self.score_batch([(prompt, response, target)])[0]

    def score_batch(self, items: list[tuple[str, str, Any]]) -> list[float]:
        """``[self(p, r, t) for p, r, t in items]``, in one trip to the scoring process."""
        out: list[float] = [0.0] * len(items)
        todo, where = [], []
        for i, (_, response, target) in enumerate(items):
            if target is None:
                raise ValueError(
                    "math: the item has no target answer; give the data a target field "
                    "(data kwargs target_field=...)"
                )
            answer = extract_final_answer(response)
            if answer is not None and len(answer) <= self.max_answer_chars:
                todo.append([str(target).strip(), answer, _soft_bound(self.timeout_s)])
                where.append(i)
        if not todo:
            return out
        for i, item, result in zip(where, todo, self._bounded().map(todo)):
            if "ok" in result:
                out[i] = float(result["ok"])
            elif result.get("error", "").startswith(_BAD_TARGET):
                raise ValueError(f"math-verify cannot parse the target {items[i][2]!r}")
            elif "error" in result:  # sympy choked on the answer: like no answer at all
                continue
            else:
                why = (
                    f"not scored within {self.timeout_s} s"
                    if "timed_out" in result
                    else f"its scoring process died (exit code {result['died']})"
                )
                logger.warning("%s: answer %r scores 0: %s", self.name, _preview(item[1]), why)
        return out


_BAD_TARGET = "BadTarget"
_GOLD_CACHE: dict[tuple[str, int], list] = {}  # in the scoring process: a group shares a target


class BadTarget(ValueError):
    """The target does not parse (the scoring process reports it by this name)."""


def _soft_bound(timeout_s: float) -> int:
    """math-verify's own (alarm, whole seconds) timeout: under the hard one, so that the
    interruptible slow cases end without killing the scoring process."""
    return max(1, int(timeout_s * 0.6))


def _parse(text: str, timeout: int) -> list:
    from math_verify import parse  # lazy: imports sympy and the LaTeX grammar

    # Plain text goes inside \boxed{} so math-verify reads it as one LaTeX expression
    # (unwrapped, "x^2+1" does not parse at all and "1,2" reads as 1.2).
    if "\\boxed" not in text and "$" not in text:
        text = f"\\boxed{{{text}}}"
    return parse(text, parsing_timeout=timeout)


def warm_up() -> None:
    """In the scoring process, at its start (``forge.rewards.bounded``): math-verify's first
    parse imports sympy and its LaTeX parser (~0.8 s quiet, several times that on a loaded
    host), which would otherwise count against the first answer's time bound."""
    score_pair(["1", "\\boxed{1}", 1])


def score_pair(item: list) -> float:
    """In the scoring process: ``[target, answer, soft timeout]`` -> 1.0 | 0.0."""
    from math_verify import verify

    target, answer, timeout = item
    gold = _GOLD_CACHE.get((target, timeout))
    if gold is None:
        gold = _parse(target, timeout)
        if not gold:
            raise BadTarget(target)
        if len(_GOLD_CACHE) > 1024:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[(target, timeout)] = gold
    pred = _parse(answer, timeout)
    if not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0


def _preview(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
