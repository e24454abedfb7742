"""Calculator: products of two 3-digit numbers, answered with a ``mul`` tool.

One episode (at most ``max_turns`` model turns)::

    user:       What is 347*892?
    assistant:  <tool_call>{"name":"mul","arguments":{"a":347,"b":892}}</tool_call>
    tool:       309524                      (run by the episode runner, not the env)
    assistant:  309524                      -> env.step: exact match, reward 1 or 0, done

A tiny model cannot multiply 3-digit numbers in its head, but it can learn to copy the
factors into a call and the tool's result into its answer. Plugins of this task (named by
import string in ``apps/calc/cpu.yaml``):

- ``mul``: the tool (a plain function; its type hints give the schema);
- ``Calculator``: the environment (``forge.envs.Environment``); it checks the final answer;
- ``Products``: the data source of tasks ``{"a", "b", "target"}`` (held out: a fixed set);
- ``CallConversations``: SFT data that teaches the call format: the user's question, the
  call, the tool's result and the answer. A fraction ``wrong_args`` of the calls carry
  random factors instead of the question's (the tool then returns *their* product and the
  assistant repeats it), so SFT teaches the format and the copying of the result fully,
  and the copying of the factors only partly: that is left for GRPO to sharpen;
- ``DirectAnswers``: SFT data for the no-tool baseline: the question, then the product.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from forge import Environment, StepResult

_INT = re.compile(r"-?\d+")
_MAX_DIGITS = 100


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def question(a: int, b: int) -> str:
    return f"What is {a}*{b}?"


def call_text(a: int, b: int) -> str:
    """The assistant's call of ``mul``: Hermes tags around compact JSON (every byte is a
    token of the tiny model, so no spaces)."""
    body = json.dumps({"name": "mul", "arguments": {"a": a, "b": b}}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"


def parse_answer(text: str) -> int | None:
    """The first integer in the model's text, or None; None too when that integer has over
    ``_MAX_DIGITS`` digits (no answer here has, and ``int()`` raises ``ValueError`` past
    4,300)."""
    m = _INT.search(text)
    return int(m.group(0)) if m and len(m.group(0)) <= _MAX_DIGITS else None


class Calculator(Environment):
    """One question; ``task`` is ``{"a": int, "b": int}``. The first answer that is not a tool
    call ends the episode: success 1 if its first integer is ``a*b``, else 0."""

    def __init__(self) -> None:
        self.product = 0

    async def reset(self, task: dict[str, Any]) -> str:
        a, b = int(task["a"]), int(task["b"])
        self.product = a * b
        return question(a, b)

    async def step(self, action: str) -> StepResult:
        answer = parse_answer(action)
        success = float(answer == self.product)
        return StepResult(None, reward={"success": success}, done=True, info={"answer": answer})


def _factors(rng: random.Random, low: int, high: int) -> tuple[int, int]:
    return rng.randint(low, high), rng.randint(low, high)


class Products:
    """Tasks ``{"a", "b", "prompt", "target"}`` with ``low <= a, b <= high``: training tasks
    drawn from ``seed``, a fixed held-out set of ``heldout_size`` drawn from another stream."""

    def __init__(self, low: int = 100, high: int = 999, heldout_size: int = 64, seed: int = 0):
        if not 0 <= low <= high:
            raise ValueError(f"Products needs 0 <= low <= high, got low={low} high={high}")
        self.low, self.high, self.heldout_size = low, high, heldout_size
        self.rng = random.Random(seed)

    def _task(self, a: int, b: int) -> dict:
        return {"a": a, "b": b, "prompt": question(a, b), "target": a * b}

    def sample(self) -> dict:
        return self._task(*_factors(self.rng, self.low, self.high))

    def heldout(self) -> list[dict]:
        rng = random.Random(12345)  # the same questions whatever the training seed
        return [self._task(*_factors(rng, self.low, self.high)) for _ in range(self.heldout_size)]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def tool_conversation(a: int, b: int, call_a: int, call_b: int) -> list[dict]:
    """The transcript of one episode whose call carries ``call_a``, ``call_b``; the tool
    message is what ``ToolSet`` would send back, and the answer repeats it."""
    result = str(mul(call_a, call_b))
    return [
        {"role": "user", "content": question(a, b)},
        {"role": "assistant", "content": call_text(call_a, call_b)},
        {"role": "tool", "name": "mul", "content": result},
        {"role": "assistant", "content": result},
    ]


class CallConversations:
    """SFT data: whole tool-using episodes; a fraction ``wrong_args`` of the calls carry
    random factors (see the module docstring)."""

    def __init__(self, low: int = 100, high: int = 999, wrong_args: float = 0.5, seed: int = 0):
        if not 0.0 <= wrong_args <= 1.0:
            raise ValueError(f"wrong_args must be in [0, 1], got {wrong_args}")
        self.low, self.high, self.wrong_args = low, high, wrong_args
        self.rng = random.Random(seed)

    def sample(self) -> dict:
        a, b = _factors(self.rng, self.low, self.high)
        call_a, call_b = a, b
        if self.rng.random() < self.wrong_args:
            call_a, call_b = _factors(self.rng, self.low, self.high)
        return {"messages": tool_conversation(a, b, call_a, call_b)}

    def heldout(self) -> list[dict]:
        return []


def tokenizer_corpus(size: int = 200, seed: int = 0) -> list[str]:
    """Texts of this task for the tiny tokenizer's BPE merges: the call's fixed parts become
    a few tokens each (digits stay one token each: the pre-tokeniser splits them)."""
    source = CallConversations(wrong_args=0.0, seed=seed)
    texts = ["user", "assistant", "tool"]
    for _ in range(size):
        texts += [m["content"] for m in source.sample()["messages"]]
    return texts


class DirectAnswers:
    """SFT data for the no-tool baseline: the question, then the product as the answer."""

    def __init__(self, low: int = 100, high: int = 999, seed: int = 0):
        self.low, self.high = low, high
        self.rng = random.Random(seed)

    def sample(self) -> dict:
        a, b = _factors(self.rng, self.low, self.high)
        return {
            "messages": [
                {"role": "user", "content": question(a, b)},
                {"role": "assistant", "content": str(a * b)},
            ]
        }

    def heldout(self) -> list[dict]:
        return []
