"""Every function that reads model-written text, on hostile text (issue 56, section 2).

A policy writes anything: long runs of whitespace, brackets nested a thousand deep, a
``\\boxed{`` opened four thousand times and never closed. Each parser must return within
``BUDGET_S`` or raise one of the named errors its entry lists (which the run treats as a bad
episode or a bad request), never anything else: a regex that backtracks for seconds holds
the GIL and freezes the actor that runs it, and an unexpected exception stops the run.

``PARSERS`` is the one registry of those functions with how to call each; the property test
runs every entry on adversarial text up to ``MAX_CHARS`` long, the named repros run on every
entry, and ``test_every_text_reader_is_registered`` fails when a public function or method
that takes model text (a parameter named ``response``, ``text``, ``completion`` or
``action``) in the scanned modules is neither registered nor exempted with a reason.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import apps
import forge.integrations
import forge.rewards
from apps.arith import task as arith
from apps.calc import task as calc
from apps.guess import task as guess
from apps.sumdigits import task as sumdigits
from forge.envs.tool_parser import PARSERS as TOOL_PARSERS
from forge.envs.tool_parser import HermesToolParser, ToolCallError, build_tool_parser
from forge.generation.hf_engine import HFEngine, _Row
from forge.rewards import (
    ExactMatch,
    LengthPenalty,
    MathReward,
    ThinkingReward,
    extract_final_answer,
)
from forge.serve.parse import BadRequest, read_json
from forge.types import SamplingParams

# 16x the max_tokens of a small run (256 tokens) at up to 8 characters a token.
MAX_CHARS = 16 * 256 * 8
# Each call's bound. The linear parsers take a few milliseconds on the longest texts; the
# repros below took 10-25 s before their fixes.
BUDGET_S = 0.1
TEXT_PARAMS = {"response", "text", "completion", "action"}


@dataclass(frozen=True)
class Parser:
    """One way of running a function that reads model text."""

    covers: str  # "module:qualname" of the function or method it runs
    call: Callable[[str], object]
    errors: tuple[type[BaseException], ...] = ()  # the named errors it may raise
    variant: str = ""

    @property
    def name(self) -> str:
        return f"{self.covers}[{self.variant}]" if self.variant else self.covers


def _drive(coro):
    """The result of a coroutine that never waits (the apps' environment steps)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the coroutine waited; run it in an event loop instead")


class _ScoresZero:
    """``MathReward``'s scoring processes, faked: every answer scores 0. What runs in the
    reward actor (finding the answer) is under test here; the processes are killed past their
    timeout (tests/integration/hostile/test_reward_bombs.py)."""

    def map(self, items: list) -> list[dict]:
        return [{"ok": 0.0} for _ in items]


def _math_reward(text: str) -> float:
    reward = MathReward()
    reward._scorer = _ScoresZero()
    return reward("q", text, "1")


def _env_step(env_cls, task: dict, text: str):
    env = env_cls()
    _drive(env.reset(task))
    return _drive(env.step(text))


def _hf_stop_strings(text: str) -> str:
    """``HFEngine``'s stop-string check on a row whose decoded text is ``text``: the engine's
    own method, on a stand-in for the engine (the check reads only these fields)."""
    engine = SimpleNamespace(eos_ids={0}, max_positions=None, _decode=lambda ids: text)
    params = SamplingParams(max_tokens=10**6, stop=["</answer>", "\n\n\n", "<|im_end|>"])
    row = _Row(0, 0, "", [], params, seed=0, version=0, token_ids=[1])
    HFEngine._check_stop(engine, row)
    return row.text


@cache
def _reasoning_gym():
    from forge.integrations.reasoning_gym import ReasoningGymReward, ReasoningGymSource

    entry = ReasoningGymSource("chain_sum", size=2, heldout_size=0, seed=0).sample()["target"]
    return ReasoningGymReward("chain_sum"), entry


def _rg_call(text: str) -> float:
    reward, entry = _reasoning_gym()
    return reward("q", text, entry)


def _tinker_reward(text: str) -> float:
    from apps.tinker.rl_loop import reward

    return reward(text)


_GSM8K = r"####\s*(.+)"  # ExactMatch's documented pattern
_RG = "forge.integrations.reasoning_gym:ReasoningGymReward"

PARSERS: list[Parser] = [
    Parser("forge.rewards.math_reward:extract_final_answer", extract_final_answer),
    Parser("forge.rewards.math_reward:MathReward.__call__", _math_reward),
    Parser("forge.rewards.exact_match:ExactMatch.extract", ExactMatch().extract),
    Parser(
        "forge.rewards.exact_match:ExactMatch.extract", ExactMatch(_GSM8K).extract, variant="gsm8k"
    ),
    Parser(
        "forge.rewards.exact_match:ExactMatch.__call__",
        lambda t: ExactMatch(_GSM8K, ignore_case=True)("q", t, "1"),
    ),
    Parser("forge.rewards.format:ThinkingReward.__call__", lambda t: ThinkingReward()("q", t)),
    Parser(
        "forge.rewards.format:ThinkingReward.__call__",
        lambda t: ThinkingReward(prompt_opens_think=True)("q", t),
        variant="prompt_opens_think",
    ),
    Parser("forge.rewards.format:LengthPenalty.__call__", lambda t: LengthPenalty(10, 100)("q", t)),
    *[
        Parser(f"{cls.__module__}:{cls.__qualname__}.parse", build_tool_parser(name).parse)
        for name, cls in sorted(TOOL_PARSERS.items())
    ],
    Parser("forge.generation.hf_engine:HFEngine._check_stop", _hf_stop_strings),
    Parser("forge.serve.parse:read_json", lambda t: read_json(t.encode()), (BadRequest,)),
    Parser(f"{_RG}.extract", lambda t: _reasoning_gym()[0].extract(t)),
    Parser(f"{_RG}.__call__", _rg_call),
    Parser("apps.arith.task:correct", lambda t: arith.correct("q", t, "42")),
    Parser("apps.arith.task:strict", lambda t: arith.strict("q", t, "42")),
    Parser("apps.arith.task:contains", lambda t: arith.contains("q", t, "42")),
    Parser("apps.calc.task:parse_answer", calc.parse_answer),
    Parser(
        "apps.calc.task:Calculator.step",
        lambda t: _env_step(calc.Calculator, {"a": 12, "b": 34}, t),
    ),
    Parser("apps.guess.task:parse_guess", guess.parse_guess),
    Parser(
        "apps.guess.task:GuessNumber.step", lambda t: _env_step(guess.GuessNumber, {"secret": 5}, t)
    ),
    Parser("apps.sumdigits.task:parse_answer", sumdigits.parse_answer),
    Parser(
        "apps.sumdigits.task:sumdigits_reward", lambda t: sumdigits.sumdigits_reward("q", t, "7")
    ),
    Parser("apps.tinker.rl_loop:reward", _tinker_reward),
]

# Text readers the property test does not run, and why.
EXEMPT = {
    "forge.rewards.aggregate:RewardFn.__call__": "the reward-function protocol, no code",
    "forge.rewards.aggregate:evaluate_rewards": "hands the text to reward functions (registered)",
    "forge.envs.tool_parser:ToolParser.parse": "the base class; each of PARSERS is registered",
    "forge.integrations.openenv:OpenEnvClient.step": "sends the text to the OpenEnv server",
    "forge.integrations.textarena:TextArenaEnv.step": "hands the text to textarena's game",
    "forge.integrations.verifiers:VerifiersEnv.step": "hands it to the bridge, which reads "
    "tool calls with a registered tool parser",
    "forge.integrations.verifiers_bridge:Channel.answer": "queues the text for the bridge",
}

# The repros (10-25 s, or a RecursionError that stopped the run, before the fixes).
REPROS = {
    "answer_2000_spaces": "answer" + " " * 2000,
    "answer_is_16000_spaces": "The answer is" + " " * 16000,
    "boxed_28kb_unclosed": "\\boxed{" * 4000,
    "tool_call_1000_brackets": "<tool_call>" + "[" * 1000 + "</tool_call>",
    "tool_call_1000_brackets_unclosed": "<tool_call>" + "[" * 1000,
    "tool_call_deep_arguments": '<tool_call>{"name": "f", "arguments": "'
    + "[" * 1000
    + '"}</tool_call>',
    "tool_call_4000_digit_number": "<tool_call>" + "1" * 5000 + "</tool_call>",
    "tool_call_3000_unclosed_tags": "<tool_call>" * 3000,
    "answer_tag_4000_unclosed": "<answer>" * 4000,
    "integer_5000_digits": "1" * 5000,
}

# Pieces of hostile text: whitespace, brackets, unclosed delimiters, the tags the parsers look
# for, digits and punctuation they read numbers from, and non-ASCII.
_PIECES = [
    *' \n\t\u2003[{(]})"\\:：*$/9é𝟙\ufffd\x00\u202e',
    "\\boxed{",
    "\\fbox {",
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "answer",
    "Answer is **",
    "####",
    "-1",
    "1,000",
    ".5",
]
# What the parsers look for around a body: a hostile body goes between these.
_AROUND = [
    ("", ""),
    ("<tool_call>", "</tool_call>"),
    ('<tool_call>{"name": "f", "arguments": "', '"}</tool_call>'),
    ("\\boxed{", "}"),
    ("<answer>", "</answer>"),
    ("<think>", "</think>"),
    ("The answer is", ""),
    ("####", ""),
]
_OPENERS = ["[", "{", "(", '{"a": ', '[{"name": ', "\\boxed{", "\\frac{", "<tool_call>"]


def _count(most: int) -> st.SearchStrategy[int]:
    """A repeat count: small, or long enough to reach ``MAX_CHARS``."""
    most = max(1, most)
    return st.one_of(st.integers(1, 64), st.sampled_from([1000, most // 4, most]))


@st.composite
def _runs(draw) -> str:
    """A few runs, each a short mix of pieces repeated up to ``MAX_CHARS`` long."""
    runs = []
    for _ in range(draw(st.integers(1, 3))):
        unit = "".join(draw(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4)))
        runs.append(draw(st.text(max_size=8)) + unit * draw(_count(MAX_CHARS // len(unit))))
    return "".join(runs)


@st.composite
def _nesting(draw) -> str:
    """Brackets opened deep, then closed or not."""
    opener = draw(st.sampled_from(_OPENERS))
    depth = draw(_count(MAX_CHARS // len(opener)))
    closer = {"[": "]", "(": ")", "<": ">"}.get(opener[0], "}")
    return opener * depth + closer * draw(st.sampled_from([0, 1, depth]))


@st.composite
def hostile_texts(draw) -> str:
    """A hostile body (long runs, deep nesting, unicode) inside what a parser looks for."""
    before, after = draw(st.sampled_from(_AROUND))
    body = draw(st.one_of(_runs(), _nesting(), st.text(max_size=2000)))
    return before + body[: MAX_CHARS - len(before) - len(after)] + after


def _ran_for(parser: Parser, text: str) -> float:
    """The seconds one call takes (the fastest of up to three when over budget, so a busy
    machine's pause is not blamed on the parser). Any error but the entry's own propagates."""
    parser.call("")  # untimed: a first call imports modules or builds a dataset
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        try:
            parser.call(text)
        except parser.errors:
            pass
        took = time.perf_counter() - start
        best = min(best, took)
        if best < BUDGET_S or took > 10 * BUDGET_S:  # in budget, or far too slow for noise
            break
    return best


def _check(parser: Parser, text: str) -> None:
    took = _ran_for(parser, text)
    shown = text if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} chars)"
    assert took < BUDGET_S, f"{parser.name} took {took * 1000:.0f} ms on {shown}"


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
@pytest.mark.parametrize("repro", REPROS)
def test_repros_return_in_budget(parser: Parser, repro: str) -> None:
    _check(parser, REPROS[repro])


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.name)
@settings(
    max_examples=30,
    deadline=None,  # timed by _check, which retries once over budget
    phases=[Phase.explicit, Phase.generate],  # no shrinking: one slow example says enough
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=hostile_texts())
def test_hostile_text_returns_in_budget_or_raises_a_named_error(parser: Parser, text: str):
    _check(parser, text)


def test_a_deeply_nested_tool_call_is_a_bad_call():
    for repro in ("tool_call_1000_brackets", "tool_call_deep_arguments"):
        [call] = HermesToolParser().parse(REPROS[repro])
        assert isinstance(call, ToolCallError) and "nested too deeply" in call.message
    [call] = HermesToolParser().parse(REPROS["tool_call_4000_digit_number"])
    assert isinstance(call, ToolCallError) and "not valid JSON" in call.message


def _scanned_modules() -> list[str]:
    names = []
    for package in (forge.rewards, forge.integrations):
        names += [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    names += ["forge.envs.tool_parser", "forge.serve.parse", "apps.tinker.rl_loop"]
    apps_dir = Path(apps.__file__).parent
    names += [f"apps.{p.parent.name}.task" for p in sorted(apps_dir.glob("*/task.py"))]
    return names


def _takes_text(fn) -> bool:
    try:
        return bool(TEXT_PARAMS & set(inspect.signature(fn).parameters))
    except (TypeError, ValueError):
        return False


def _text_readers(module_name: str) -> set[str]:
    """``module:qualname`` of each public function and method in the module (its ``__all__``,
    else its public names defined there) with a model-text parameter."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    found = set()
    for name in names:
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isfunction(obj) and _takes_text(obj):
            found.add(f"{module_name}:{name}")
        elif inspect.isclass(obj):
            for attr, fn in vars(obj).items():
                public = not attr.startswith("_") or attr == "__call__"
                if public and inspect.isfunction(fn) and _takes_text(fn):
                    found.add(f"{module_name}:{obj.__qualname__}.{attr}")
    return found


def test_every_text_reader_is_registered():
    found = set().union(*map(_text_readers, _scanned_modules()))
    registered = {p.covers for p in PARSERS}
    missing = sorted(found - registered - set(EXEMPT))
    assert not missing, (
        f"{missing} read model text but are not in this file's PARSERS: add each with how to "
        "call it (or to EXEMPT, saying why it reads no text itself)"
    )
    stale = sorted(name for name in registered | set(EXEMPT) if not _exists(name))
    assert not stale, f"{stale} are registered but no longer exist (renamed? update PARSERS)"


def _exists(covers: str) -> bool:
    module_name, qualname = covers.split(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is not None
