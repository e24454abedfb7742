"""Forge on a Ray cluster whose head has CPUs, as a plain ``ray start --head`` gives (slow
suite, needs root). The run's single actors keep together on the first live node, the head;
service replicas must go to nodes with room for them, spread among those
(``controller._ray.pick_node``), not to the node with the fewest replicas whether or not it is
full. Two simulated hosts (``tests/multihost/cluster.py``); run as root with
``python -m pytest -q -m multihost tests/multihost/test_ray_head_cpus.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'forge[ray]')")

from tests.multihost import cluster as ray_cluster  # noqa: E402
from tests.multihost import netns  # noqa: E402
from tests.multihost.conftest import _lock  # noqa: E402
from tests.multihost.test_ray_cluster import (  # noqa: E402
    _forge_workers,
    _placement,
    _run,
    _script,
    _steps,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

HOSTS = 2


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """The head (Ray's default CPUs: every CPU of this machine) and two hosts; afterwards no
    Forge worker may be left on any host."""
    why = netns.unavailable_reason()
    if why:
        pytest.skip(why)
    fd = _lock()
    try:
        logs = tmp_path_factory.mktemp("ray-logs")
        with ray_cluster.running_cluster(HOSTS, logs, head_cpus=None) as c:
            yield c
            deadline = time.monotonic() + 30
            while (left := _forge_workers(c)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not left, f"Forge workers left on the hosts after the tests: {left}"
    finally:
        os.close(fd)


FULL_HEAD = """
import asyncio, json
import ray
from controller import _ray, shutdown
from tests.multihost.actors import Where
from tests.integration.controller.service_actors import Echo

async def main():
    _ray.connect()
    head = next(n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == "10.77.0.1")
    cpus = int(head["Resources"]["CPU"])
    single = await Where.options(procs=cpus).as_actor()  # the run's state: fills the head
    out = {"head_cpus": cpus, "single": [w["ip"] for w in (await single.where.call()).values()]}
    svc = await Echo.options(num_replicas=3).as_service()
    out["replicas"] = [r.mesh._infos[0].address.split(":")[1] for r in svc.replicas]
    out["echo"] = [await svc.echo.route(i) for i in range(6)]
    print("RESULT", json.dumps(out), flush=True)
    await shutdown()

asyncio.run(main())
"""


def test_replicas_skip_a_full_head_and_spread_over_the_hosts(hosts, tmp_path):
    out = _script(tmp_path, hosts, FULL_HEAD)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert r["head_cpus"] >= 1
    assert set(r["single"]) == {ray_cluster.HEAD_IP}, r  # the run's state is on the head
    host_ips = {h.ip for h in hosts.hosts}
    assert set(r["replicas"]) == host_ips, r  # not on the full head; on both hosts
    assert r["echo"] == list(range(6))


def test_grpo_with_two_reward_replicas_on_a_head_with_cpus(hosts, tmp_path):
    """The issue's run: the CPU demo with ``rl.replicas.rewards=2`` stopped at spawn with "no
    room for mesh 'RewardActor-r0'" (its replica was pinned to the full head)."""
    steps = 4
    proc = _run(
        tmp_path,
        hosts,
        [f"rl.steps={steps}", "sft.steps=5", "rl.eval.every=0", "rl.replicas.rewards=2"],
    )
    run = tmp_path / "run"
    try:
        deadline = time.monotonic() + 600
        where = {}
        while proc.poll() is None and time.monotonic() < deadline:
            if (run / "status.json").exists():
                try:
                    where = _placement(run)
                except (ValueError, KeyError, StopIteration):
                    pass
                if len(where.get("RewardActor", ())) == 2:
                    break
            time.sleep(0.5)
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-4000:]
    assert "no room for mesh" not in log, log[-4000:]
    assert [s["step"] for s in _steps(run)] == list(range(1, steps + 1))
    assert len(where.get("RewardActor", ())) == 2, where  # one replica per node, two nodes
