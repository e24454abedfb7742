"""Small verifiers (0.4.0, ``verifiers.v1``) environments built in code, for the adapter's tests.

verifiers 0.4.0 has no SingleTurnEnv/MultiTurnEnv/ToolEnv/Rubric: an environment is a
``vf.Env`` over a ``vf.Taskset`` whose ``vf.Task`` scores with ``@vf.reward`` methods
(weighted), may end a rollout with ``@vf.stop`` predicates, and serves tools from
``vf.Toolset`` classes with ``@vf.tool`` methods. A multi-turn environment is a ``vf.Env``
subclass whose ``run(task, agents)`` answers each reply (``interaction.turn(message)``) and
decides when the exchange is over. The three shapes the adapter must carry:

- ``load_single``: a single-turn taskset (add two numbers), two weighted rewards;
- ``load_multi``: a guessing game, the Env answering "higher"/"lower" until the guess is
  right (its completion rule), a ``@vf.stop`` on the trace, two rewards;
- ``load_tools``: a taskset whose task serves a ``vf.Toolset`` with a python-function tool
  (``multiply``), a reward reading the tool results from the trace.

verifiers finds a taskset (and the Env it ships) by a top-level module name, as it finds an
installed package; ``_plugin`` registers these in-code classes under such a name when a
loader is called (the way installing the package would), nothing at import time.
"""

from __future__ import annotations

import re
import sys
import types

import verifiers.v1 as vf

__all__ = ["load_multi", "load_single", "load_tools"]


def _plugin(name: str, *classes: type) -> str:
    """Make ``classes`` importable as the plugin module ``name``; returns ``name``."""
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__all__ = [c.__name__ for c in classes]
        for c in classes:
            setattr(module, c.__name__, c)
        sys.modules[name] = module
    return name


def _env(taskset_id: str, max_turns: int | None = None, **taskset: object) -> vf.Env:
    """The environment verifiers itself would build for the taskset (its ``load_environment``),
    with the tool-less chat harness (Forge plays the agent, the harness never runs)."""
    agent = {"harness": {"id": "null"}, "max_turns": max_turns}
    config = vf.resolve_env_config({"taskset": {"id": taskset_id, **taskset}, "agent": agent})
    return vf.load_environment(config)


def _last_int(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


# -- single turn: add two numbers ---------------------------------------------------------


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(_last_int(trace.last_reply) == task.answer)

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 4 else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    size: int = 12


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.size):
            a, b = i % 5 + 1, i // 5 + 2
            yield SumTask(
                SumData(
                    prompt=f"{a}+{b}=",
                    system_prompt="Answer with the number only.",
                    answer=a + b,
                ),
                self.config.task,
            )


def load_single(size: int = 12) -> vf.Env:
    """The single-turn environment (``SingleAgentEnv`` over ``SumTaskset``)."""
    return _env(_plugin("forge_vf_test_sum", SumTaskset), size=size)


# -- multi turn: guess the number ---------------------------------------------------------


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(trace.info.get("found", False))

    @vf.reward(weight=0.1)
    async def speed(self, trace: vf.Trace) -> float:
        return -float(trace.num_turns)

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        """The exchange ends when the player says it gives up."""
        return "give up" in trace.last_reply.lower()


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in range(1, 9):
            yield GuessTask(
                GuessData(prompt="Guess my number from 1 to 8.", secret=secret),
                self.config.task,
            )


class GuessEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """The env plays the user: "higher"/"lower" after each guess, done when it is right."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guess = _last_int(segment.last_reply)
                if guess == task.data.secret:
                    interaction.trace.info["found"] = True
                    break
                hint = "a number, please" if guess is None else None
                hint = hint or ("higher" if guess < task.data.secret else "lower")
                segment = await interaction.turn(hint)


def load_multi(max_turns: int | None = None) -> vf.Env:
    """The multi-turn environment (``GuessEnv`` over ``GuessTaskset``)."""
    return _env(_plugin("forge_vf_test_guess", GuessTaskset, GuessEnv), max_turns)


# -- tools: a python function the model calls ---------------------------------------------


class MathTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # advertise the tools bare: "multiply"

    @vf.tool
    async def multiply(self, a: int, b: int) -> str:
        """Multiply two integers."""
        return str(a * b)


class ProductData(vf.TaskData):
    answer: int


class ProductTask(vf.Task[ProductData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [MathTools(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, task: ProductData, trace: vf.Trace) -> float:
        return float(_last_int(trace.last_reply) == task.answer)

    @vf.reward(weight=0.25)
    async def used_tool(self, task: ProductData, trace: vf.Trace) -> float:
        return float(any(str(task.answer) in str(m.content) for m in trace.tool_messages))


class ProductTaskset(vf.Taskset[ProductTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(12, 34), (56, 78), (91, 23)]:
            yield ProductTask(
                ProductData(prompt=f"What is {a} times {b}? Use the tool.", answer=a * b),
                self.config.task,
            )


def load_tools() -> vf.Env:
    """The tool environment (``SingleAgentEnv`` over ``ProductTaskset``)."""
    return _env(_plugin("forge_vf_test_product", ProductTaskset))
