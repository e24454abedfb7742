"""An app for ``forge top`` tests: a two-replica service, one replica killed and restarted,
then the run finishes, crashes or hangs (to be killed) as the config says."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from controller.status import set_status_field
from tests.integration.controller.service_actors import Echo


@dataclass
class Config:
    app: str
    end: str = "finish"  # finish | crash | hang


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    svc = await Echo.options(num_replicas=2, health_poll_rate=0.05).as_service()
    victim = svc.metrics()[0]["pids"][0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while svc.metrics()[0]["restarts"] < 1 or svc.metrics()[0]["state"] != "healthy":
        assert time.monotonic() < deadline, "replica 0 did not come back"
        await asyncio.sleep(0.05)
    set_status_field("rl", {"stage": "test", "step": 7, "steps_total": 10})
    await asyncio.sleep(1.5)  # a background write or two
    print(f"KILLED {victim}", flush=True)
    if cfg.end == "crash":
        raise RuntimeError("the reward went NaN")
    if cfg.end == "hang":
        await asyncio.sleep(300)
