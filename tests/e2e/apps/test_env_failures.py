"""Multi-turn runs survive their environments: raising, hanging, and a replica SIGKILLed
mid-run. Failed episodes are replayed (on another replica) or dropped and counted; the run
finishes its steps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from apps.grpo.main import Config, train
from forge.config.schema import config_from_dict
from forge.models import make_tiny_model
from tests.helpers import actor_processes, wait_dead


def _config(model, env: dict, steps: int = 3, env_replicas: int = 0) -> Config:
    data = {
        "replicas": {"env": env_replicas},
        "app": "apps.grpo.main",
        "policy": {"model": str(model)},
        "steps": steps,
        "max_policy_age": 1,
        "data": {
            "fn": "apps.sumdigits.task:SumDigits",
            "kwargs": {"digits_min": 1, "digits_max": 2},
        },
        "env": {"max_turns": 3, "max_context_tokens": 256, **env},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_tokens": 4, "tasks": 2},
        "generator": {"max_batch_size": 16},
        "trainer": {"optimizer": {"lr": 1.0e-4}},
        "eval": {"at_start": False, "at_end": False},
    }
    return config_from_dict(Config, data)


def _metric_sum(run_dir, key: str) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r.get(key, 0.0) for r in rows)


def test_raising_and_hanging_environments_are_replayed(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    cfg = _config(
        model,
        {
            "fn": {"fn": "tests.e2e.apps.flaky_env:Flaky", "kwargs": {"fail": 0.15, "hang": 0.1}},
            "step_timeout_s": 0.5,
            "retries": 3,
        },
    )
    result = asyncio.run(train(cfg, tmp_path))
    assert result["version"] == 3
    assert _metric_sum(tmp_path, "env/retried_episodes") > 0  # failures were replayed


def test_an_env_replica_killed_mid_run(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    env = {
        "fn": {"fn": "tests.e2e.apps.flaky_env:Flaky", "kwargs": {"slow_s": 0.05}},
        "retries": 3,
    }
    cfg = _config(model, env, steps=6, env_replicas=2)
    killed: list[int] = []

    async def kill_one_env_replica():
        while not killed:
            await asyncio.sleep(0.5)
            for pid in actor_processes(os.getpid(), "EnvActor"):
                if (tmp_path / "metrics.jsonl").exists():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break

    async def main():
        killer = asyncio.create_task(kill_one_env_replica())
        try:
            return await train(cfg, tmp_path)
        finally:
            killer.cancel()

    result = asyncio.run(main())
    assert killed and not wait_dead(killed, 5)
    assert result["version"] == 6  # the run finished every step


def test_gym_tuples_train_and_a_wrong_shape_stops_the_run_at_once(tmp_path):
    model = make_tiny_model(tmp_path / "model", preset="tiny")
    cfg = _config(model, {"fn": "tests.e2e.apps.flaky_env:GymTuple"}, steps=2)
    assert asyncio.run(train(cfg, tmp_path / "ok"))["version"] == 2
    bad = _config(
        model, {"fn": {"fn": "tests.e2e.apps.flaky_env:GymTuple", "kwargs": {"bad": True}}}
    )
    bad.batch_timeout_s = 60
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        asyncio.run(train(bad, tmp_path / "bad"))
    chain, e = [], caught.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("env.step returned list" in m for m in chain), chain
    assert time.monotonic() - start < 50
