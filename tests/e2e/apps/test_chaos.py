"""Chaos: the CPU demo with a random generator or reward replica SIGKILLed every ~10 s
(``benchmarks/chaos.py``, shortened) finishes its steps, learns, loses no request and no
episode, and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import pytest

from controller import ActorError, shutdown
from tests.helpers import REPO, script_env, wait_dead
from tests.integration.controller.service_actors import Echo


def test_service_request_counts_add_up_across_a_replica_kill():
    """What the chaos benchmark counts: every routed request is completed, failed or
    cancelled; those on a killed replica are re-sent (retried) and complete."""

    async def main():
        svc = await Echo.options(num_replicas=2).as_service()
        try:
            calls = [svc.slow_pid.route(1.0).start() for _ in range(6)]
            await asyncio.sleep(0.3)
            victim = svc.metrics()[0]["pids"][0]
            os.kill(victim, signal.SIGKILL)
            served = await asyncio.gather(*calls)
            assert victim not in served and len(served) == 6
            with pytest.raises(ActorError):
                await svc.fail.route("no")
            slow = asyncio.ensure_future(svc.slow_pid.route(5.0))
            await asyncio.sleep(0.3)
            slow.cancel()
            await asyncio.gather(slow, return_exceptions=True)
            return victim, svc.request_counts()
        finally:
            await shutdown()

    victim, counts = asyncio.run(main())
    assert counts == {"sent": 8, "retried": 3, "completed": 6, "failed": 1, "cancelled": 1}
    assert not wait_dead([victim], 5)


@pytest.mark.timeout(1200)
def test_cpu_demo_under_replica_kills(tmp_path):
    # 150 steps: at 100 the GRPO stage of a quiet machine (2026-11-26) lasted ~40 s, which at
    # one kill every 5-15 s left room for only 2 kills.
    steps = 150
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            "--every",
            "10",
            "--sft-steps",
            "150",
            "--grpo-steps",
            str(steps),
            "--eval-every",
            "0",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
        cwd=REPO,
        timeout=1150,
    )
    tail = out.stdout[-4000:] + out.stderr[-4000:]
    assert out.returncode == 0, tail
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("chaos_kills="), tail
    s = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", last)}
    assert s["chaos_kills"] >= 3, last  # the GRPO stage lasts well over 45 s
    assert s["lost_requests"] == 0 and s["lost_episodes"] == 0, tail
    assert s["orphans"] == 0, tail
    assert s["steps"] == steps, last
    assert s["replicas_back"] >= s["chaos_kills"] - 1, tail  # the last may be cut by the end
    assert s["heldout_accuracy"] >= s["sft_accuracy"] + 0.10, last
