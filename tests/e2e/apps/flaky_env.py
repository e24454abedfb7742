"""Environments that misbehave on purpose, for the failure tests of multi-turn runs."""

from __future__ import annotations

import asyncio
import random

from forge.envs import Environment, StepResult


class Flaky(Environment):
    """Echo game: done after 2 turns. ``fail`` of the steps raise, ``hang`` of them sleep
    far past any step timeout, and ``slow_s`` delays every step (so a kill lands mid-run)."""

    def __init__(self, fail: float = 0.0, hang: float = 0.0, slow_s: float = 0.0):
        self.fail, self.hang, self.slow_s = fail, hang, slow_s
        self.turns = 0

    async def reset(self, task):
        self.turns = 0
        return task["prompt"]

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        roll = random.random()
        if roll < self.fail:
            raise RuntimeError("flaky environment failed on purpose")
        if roll < self.fail + self.hang:
            await asyncio.sleep(3600)
        ok = action.strip()[:1].isdigit()
        return StepResult("again", reward=float(ok), done=self.turns >= 2)


class GymTuple(Environment):
    """Returns gym-style tuples; ``bad=True`` returns a list instead (a contract error)."""

    def __init__(self, bad: bool = False):
        self.bad = bad

    async def reset(self, task):
        return task["prompt"]

    async def step(self, action: str):
        if self.bad:
            return [None, 1.0, True, {}]
        return None, float(action.strip()[:1].isdigit()), True, {}
