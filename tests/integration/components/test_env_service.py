"""EnvActor as a service of real processes: one episode = one session on one replica."""

from __future__ import annotations

import asyncio
import os

import pytest

from controller import ActorError
from forge.actors.env_actor import EnvActor, RemoteEnv
from forge.envs import Environment, StepResult, run_episode
from forge.models import load_tokenizer, make_tiny_model
from forge.types import Completion


class CounterEnv(Environment):
    """Counts its steps; every observation says which process holds it and the count."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.count, self.name = turns, 0, ""

    async def reset(self, task):
        self.name = task["name"]
        return f"{self.name} pid={os.getpid()} count=0"

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(0.01)  # let the episodes interleave on the replica
        self.count += 1
        obs = f"{self.name} pid={os.getpid()} count={self.count}"
        return StepResult(obs, reward=1.0, done=self.count == self.turns)


class BrokenEnv(CounterEnv):
    def step(self, action: str) -> StepResult:  # a plain def: runs in a worker thread
        raise ValueError("broken on purpose")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))


def _policy(tok):
    async def generate(prompt_ids, **sampling):
        ids = tok("ok", add_special_tokens=False)["input_ids"] + [3]  # 3 = <|im_end|>
        return [Completion("", prompt_ids, ids, [-0.5] * len(ids), "ok", "stop", 0)]

    return generate


async def test_concurrent_episodes_stay_on_their_replicas(tok):
    svc = await EnvActor.options(num_replicas=2, procs=1).as_service(CounterEnv, {"turns": 3})
    try:
        envs = [RemoteEnv(svc) for _ in range(4)]
        trajs = await asyncio.gather(
            *(
                run_episode(env, {"name": f"ep{i}"}, _policy(tok), tok, max_turns=5)
                for i, env in enumerate(envs)
            )
        )
        pids_used = set()
        for i, traj in enumerate(trajs):
            assert traj.finish_reason == "done" and traj.num_turns == 3 and traj.reward == 3.0
            observations = [m["content"] for m in traj.messages if m["role"] == "user"]
            assert [o.split()[0] for o in observations] == [f"ep{i}"] * 4
            assert [o.split()[2] for o in observations] == [f"count={k}" for k in range(4)]
            pids = {o.split()[1] for o in observations}
            assert len(pids) == 1  # every call of the episode reached one replica
            pids_used |= pids
        assert len(pids_used) == 2  # sessions were spread over both replicas
        assert await svc.num_episodes.fanout() == [0, 0]  # run_episode closed them
        assert sum(m["sessions"] for m in svc.metrics().values()) == 0

        with pytest.raises(ActorError, match="no environment for episode 'ghost'"):
            await svc.step.route("ghost", "hi")
    finally:
        await svc.shutdown()


async def test_a_raising_remote_env_gives_an_env_error_trajectory(tok):
    svc = await EnvActor.options(num_replicas=2, procs=1).as_service(BrokenEnv)
    try:
        traj = await run_episode(RemoteEnv(svc), {"name": "b"}, _policy(tok), tok)
        assert traj.finish_reason == "env_error" and traj.num_turns == 1
        assert "ValueError" in traj.info["error"] and "broken on purpose" in traj.info["error"]
        assert await svc.num_episodes.fanout() == [0, 0]
    finally:
        await svc.shutdown()
