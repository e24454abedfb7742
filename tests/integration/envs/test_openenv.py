"""The OpenEnv adapter against real OpenEnv servers: an environment written with openenv's
base classes (tests/integration/envs/openenv_game.py), served by openenv's ``create_app`` under
uvicorn in its own process, played through Forge's episode runner and its env service."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("openenv")

from forge.actors.env_actor import EnvActor, RemoteEnv  # noqa: E402
from forge.envs import run_episode  # noqa: E402
from forge.integrations import openenv as adapter  # noqa: E402
from forge.integrations.openenv import OpenEnvClient, stop_servers  # noqa: E402
from forge.models import load_tokenizer, make_tiny_model  # noqa: E402
from forge.rollout.episodes import EnvConfig  # noqa: E402
from forge.slots import ENVIRONMENT  # noqa: E402
from tests.helpers import REPO, script_env, wait_dead  # noqa: E402
from tests.unit.test_env_runner import ScriptedPolicy  # noqa: E402

APP = "tests.integration.envs.openenv_game:app"
SAMPLING = {"max_tokens": 32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """``uvicorn`` serving the game in its own process; yields its URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            APP,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=script_env(),
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))


async def test_episodes_on_a_real_server(server, tok):
    # Secret 6: "3" -> higher, "no idea" -> a number please, "7" -> lower, "6" -> correct.
    policy = ScriptedPolicy(tok, ["3", "no idea", "7", "6"])
    env = OpenEnvClient(server, action_field="message", observation_field="feedback")
    traj = await run_episode(
        env, {"secret": 6, "prompt": "x"}, policy, tok, max_turns=6, sampling=SAMPLING
    )
    assert (traj.finish_reason, traj.num_turns) == ("done", 4)
    assert traj.turn_rewards == [0.0, 0.0, 0.0, 1.0] and traj.reward == 1.0
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert users == [
        "Guess my number from 1 to 8.",
        "higher",
        "a number, please",
        "lower",
        "correct",
    ]
    assert env.client is None  # run_episode closed the session

    # Concurrent episodes are separate server sessions; a seed picks the secret.
    async def binary_search(seed):
        env, low, high = OpenEnvClient(server, timeout_s=10), 1, 8
        first = await env.reset({"seed": seed})
        assert first == "feedback: Guess my number from 1 to 8.\nguesses: 0"  # every field
        for turn in range(1, 5):
            guess = (low + high) // 2
            result = await env.step(str(guess))
            if result.done:
                await env.close()
                return guess, turn, result.reward
            low, high = (guess + 1, high) if "higher" in result.observation else (low, guess - 1)
        raise AssertionError("binary search finds 1..8 in 4 guesses")

    found = await asyncio.gather(*(binary_search(seed) for seed in range(8)))
    assert all(reward == 1.0 and turns <= 4 for _, turns, reward in found)
    assert len({secret for secret, _, _ in found}) > 2  # the seeds chose different secrets
    assert found[:3] == list(await asyncio.gather(*(binary_search(s) for s in range(3))))


async def test_a_server_that_is_down_or_mute_fails_within_the_timeout():
    from forge.integrations.openenv import _generic_client

    _generic_client()  # openenv's import (~1 s quiet, ~5 s on a busy CI) is not the wait timed
    port = _free_port()  # nothing listens there
    env = OpenEnvClient(f"http://127.0.0.1:{port}", timeout_s=2)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"127.0.0.1:{port}.*connect failed"):
        await env.reset({})
    assert time.monotonic() - start < 3
    with socket.socket() as mute:  # accepts the TCP connection, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        env = OpenEnvClient(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout_s=1.5)
        start = time.monotonic()
        with pytest.raises((TimeoutError, ConnectionError), match="127.0.0.1"):
            await env.reset({})
        assert time.monotonic() - start < 4


async def test_server_errors_are_named(server):
    env = OpenEnvClient(server, action_field="text")  # the game's action field is "message"
    await env.reset({"seed": 1})
    with pytest.raises(RuntimeError, match=rf"OpenEnv server {server}: step failed.*message"):
        await env.step("4")
    await env.close()


async def test_forge_starts_and_stops_the_server(tok):
    envs = [OpenEnvClient(server=APP, observation_field="feedback", timeout_s=60) for _ in range(3)]
    try:
        firsts = await asyncio.gather(*(env.reset({"secret": 2}) for env in envs))
        assert firsts == ["Guess my number from 1 to 8."] * 3
        assert len(adapter._servers) == 1  # one server for the process
        pid = adapter._servers[APP].proc.pid
        assert {env.base_url for env in envs} == {adapter._servers[APP].url}
        assert (await envs[0].step("2")).reward == 1.0
        for env in envs:
            await env.close()
    finally:
        stop_servers()
    assert not wait_dead([pid], 10) and not adapter._servers
    with pytest.raises(RuntimeError, match="exited with"):
        await OpenEnvClient(server="tests.integration.envs.no_such_module:app", timeout_s=30).reset(
            {}
        )


async def test_through_the_env_service_and_the_slot(server, tok):
    spec = {"fn": "openenv", "kwargs": {"base_url": server, "observation_field": "feedback"}}
    EnvConfig(fn=spec)
    make = ENVIRONMENT.resolve(spec, key="env.fn")
    assert isinstance(make(), OpenEnvClient)
    with pytest.raises(ValueError, match="env.fn: .*no keyword argument.*'base'"):
        EnvConfig(fn={"fn": "openenv", "kwargs": {"base": server}})
    with pytest.raises(ValueError, match="exactly one of base_url"):
        make = ENVIRONMENT.resolve({"fn": "openenv", "kwargs": {}})
        make()

    from controller import shutdown

    svc = await EnvActor.options(num_replicas=1, procs=1).as_service(
        OpenEnvClient, {"base_url": server, "observation_field": "feedback"}
    )
    try:
        policy = ScriptedPolicy(tok, ["5", "1"])
        traj = await run_episode(
            RemoteEnv(svc), {"secret": 1}, policy, tok, max_turns=3, sampling=SAMPLING
        )
        assert traj.finish_reason == "done" and traj.turn_rewards == [0.0, 1.0]
        assert [m["content"] for m in traj.messages if m["role"] == "user"][1] == "lower"
    finally:
        await svc.shutdown()
        await shutdown()
