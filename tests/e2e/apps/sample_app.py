"""A minimal app for testing ``forge run``: spawns an actor, records its pid, waits."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

from controller import Actor, endpoint


@dataclass
class Inner:
    steps: int = 1
    sleep_s: float = 0.0


@dataclass
class Config:
    app: str
    greeting: str = "hello"
    inner: Inner = field(default_factory=Inner)


class Pid(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    a = await Pid.as_actor()
    pid = await a.pid.call_one()
    (run_dir / "out.txt").write_text(f"{cfg.greeting} {cfg.inner.steps} {resume} {pid}\n")
    print(f"ACTOR_PID {pid}", flush=True)
    await asyncio.sleep(cfg.inner.sleep_s)
