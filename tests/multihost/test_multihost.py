"""Forge across hosts: services, meshes and a GRPO run on simulated hosts that fail.

The hosts are network namespaces on this machine (``tests/multihost/netns.py``), each with a
Forge host agent; the controller (this process) places workers with ``FORGE_BACKEND=hosts``.
Run: ``python -m pytest -q -m multihost`` as root (see docs/multihost.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from controller import SpawnError
from controller._hosts import reset_host_pool
from tests.helpers import REPO, pid_alive, script_env, wait_dead, write_script
from tests.multihost import netns
from tests.multihost.actors import Where
from tests.runtime.service_actors import Echo

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(300)]

H1, H2 = "10.77.0.2", "10.77.0.3"


def _ip(replica) -> str:
    return replica.mesh._infos[0].address.split(":")[1]


def _ips(svc) -> list[str]:
    return [_ip(r) for r in svc.replicas]


async def _until_healthy(svc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(r.state != "healthy" for r in svc.replicas):
        assert time.monotonic() < deadline, f"replicas not healthy after {timeout} s: {svc}"
        await asyncio.sleep(0.05)


async def test_service_replicas_span_hosts_and_route_and_fanout(hosts):
    svc = await Echo.options(num_replicas=2).as_service()
    assert sorted(_ips(svc)) == [H1, H2]  # a 2-replica service spans both hosts
    pids = await svc.pid.fanout()
    assert sorted(pids) == sorted(r.mesh.pids[0] for r in svc.replicas)
    for h, ip in zip(hosts, (H1, H2)):  # each worker really runs in its host's namespace
        on_host = {r.mesh.pids[0] for r in svc.replicas if _ip(r) == ip}
        assert len(on_host) == 1 and on_host <= set(netns.ns_pids(h.ns))
    assert [await svc.echo.route(i) for i in range(20)] == list(range(20))
    served = {await svc.pid.route() for _ in range(6)}
    assert served == set(pids)  # round robin reaches both hosts
    single = await Where.as_actor()  # plain actors go on the first live host
    assert (await single.where.call_one())["ip"] == H1


async def test_mesh_over_two_hosts_calls_across_and_all_reduces(hosts):
    mesh = await Where.options(hosts=2, procs=1, env={"GLOO_SOCKET_IFNAME": "eth0"}).as_actor()
    where = (await mesh.where.call()).values()
    assert [w["ip"] for w in where] == [H1, H2]
    assert {w["master"] for w in where} == {H1}  # MASTER_ADDR is rank 0's host
    # an actor on host 1 calls one on host 2 (worker to worker, across namespaces)
    (other, x) = await mesh.slice(hosts=0).call_other.call_one(mesh.slice(hosts=1), 7)
    assert (other["ip"], x) == (H2, 7)
    assert (await mesh.all_reduce.call(1.5)).values() == [3.0, 3.0]  # gloo across hosts


async def test_sigkilled_replica_fails_over_and_restarts(hosts):
    svc = await Echo.options(num_replicas=2).as_service()
    victim = next(r for r in svc.replicas if _ip(r) == H2)
    calls = [asyncio.ensure_future(svc.echo.route(i, delay=0.05)) for i in range(40)]
    await asyncio.sleep(0.02)
    os.kill(victim.mesh.pids[0], signal.SIGKILL)
    assert await asyncio.gather(*calls) == list(range(40))  # none lost: retried elsewhere
    await _until_healthy(svc)
    assert sorted(_ips(svc)) == [H1, H2]  # its host is alive: the replica comes back there


async def test_a_failed_host_fails_over_and_is_skipped(hosts):
    svc = await Echo.options(num_replicas=2).as_service()
    assert sorted(_ips(svc)) == [H1, H2]
    calls = [asyncio.ensure_future(svc.echo.route(i, delay=0.05)) for i in range(40)]
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    killed = netns.kill_host("forgeh2")  # the agent and every worker on host 2
    assert hosts[1].agent.pid in killed and len(killed) >= 2
    assert await asyncio.gather(*calls) == list(range(40))
    await _until_healthy(svc)
    recovered_s = time.monotonic() - t0
    print(f"host failure: every call answered, replica back on {H1} in {recovered_s:.2f} s")
    assert _ips(svc) == [H1, H1]  # the lost replica restarted on the live host
    assert recovered_s < 15, recovered_s
    assert sorted(await svc.pid.fanout()) == sorted(r.mesh.pids[0] for r in svc.replicas)
    with pytest.raises(SpawnError, match=r"only 1 of 2 .* live.*10\.77\.0\.3:7100"):
        await Where.options(hosts=2).as_actor()


async def test_wrong_key_is_rejected_and_loose_key_file_refused(hosts, tmp_path, monkeypatch):
    wrong = netns.write_key_file(tmp_path / "wrong.key")
    monkeypatch.setenv("FORGE_HOSTS_KEY_FILE", str(wrong))
    reset_host_pool()
    with pytest.raises(SpawnError, match="only 0 of 2 .* rejected our key: FORGE_HOSTS_KEY_FILE"):
        await Where.as_actor()
    log = (tmp_path / "agent-forgeh1.log").read_text()
    assert "client failed authentication" in log
    os.chmod(wrong, 0o644)
    reset_host_pool()
    with pytest.raises(ValueError, match="chmod 600"):
        await Where.as_actor()


def test_a_dead_controller_leaves_no_workers_on_the_hosts(hosts, tmp_path):
    script = write_script(
        tmp_path,
        """
        import asyncio
        from tests.runtime.service_actors import Echo

        async def main():
            svc = await Echo.options(num_replicas=2).as_service()
            print("PIDS", *(r.mesh.pids[0] for r in svc.replicas), flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """,
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=script_env(), cwd=REPO
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]
        assert all(pid_alive(p) for p in pids)
        proc.kill()  # no cleanup runs: the agents see the connection drop
        proc.wait(10)
        assert wait_dead(pids, 5.0) == []
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.monarch
@pytest.mark.skipif(importlib.util.find_spec("monarch") is None, reason="needs torchmonarch")
def test_monarch_backend_on_a_host_mesh_spanning_namespaces(monarch_hosts, tmp_path):
    """Monarch's own multi-host path: worker loops in the namespaces, ``attach_to_workers`` in
    the controller (a fresh process: Monarch's transport must be chosen before first use)."""
    workers = [f"tcp://{h.ip}:{netns.MONARCH_PORT}" for h in monarch_hosts]
    script = write_script(
        tmp_path,
        f"""
        import asyncio
        from monarch.actor import attach_to_workers, enable_transport

        enable_transport("tcp://{netns.SUBNET}.1:0")  # default: unix sockets, per namespace

        from controller import shutdown, use_host_mesh
        from tests.multihost.actors import Where

        async def main():
            hm = attach_to_workers(ca="trust_all_connections", workers={workers!r})
            await asyncio.wait_for(hm.initialized, 60)
            use_host_mesh(hm)
            m = await Where.options(hosts=2, env={{"GLOO_SOCKET_IFNAME": "eth0"}}).as_actor()
            print("IPS", *[w["ip"] for w in (await m.where.call()).values()])
            other, _ = await m.slice(hosts=0).call_other.call_one(m.slice(hosts=1), 7)
            print("CROSS", other["ip"])
            print("REDUCE", *(await m.all_reduce.call(1.5)).values())
            await shutdown()

        asyncio.run(main())
        """,
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=script_env(FORGE_BACKEND="monarch"),
        cwd=REPO,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"IPS {H1} {H2}" in out.stdout
    assert f"CROSS {H2}" in out.stdout
    assert "REDUCE 3.0 3.0" in out.stdout


@pytest.mark.timeout(600)
def test_grpo_run_completes_when_a_host_fails(hosts, tmp_path):
    """The CPU demo, shortened, with 2 generator replicas on 2 hosts; host 2 is killed
    mid-run; the generator service fails over to host 1 and the run completes."""
    run = tmp_path / "run"
    args = [
        "--config",
        str(REPO / "apps/sumdigits/cpu.yaml"),
        "--run-dir",
        str(run),
        "sft.steps=20",
        "grpo.steps=10",
        "grpo.replicas.generator=2",
        "grpo.eval.at_start=false",
        "grpo.eval.every=0",
    ]
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    metrics = run / "grpo" / "metrics.jsonl"

    def steps_done() -> int:
        if not metrics.exists():
            return 0
        return sum("train/loss" in x for x in metrics.read_text().splitlines())

    try:
        deadline = time.monotonic() + 400
        while steps_done() < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before host 2 could be failed"
        assert steps_done() >= 3, "the run made no progress within 400 s"
        on_h2 = [p for p in netns.ns_pids("forgeh2") if p != hosts[1].agent.pid]
        assert on_h2, "no worker was placed on host 2"
        netns.kill_host("forgeh2")
        failed_at = steps_done()
        rc = proc.wait(timeout=400)
    finally:
        proc.kill()
        proc.wait(30)
        log.close()
    out = (tmp_path / "run.log").read_text()
    assert rc == 0, out[-4000:]
    assert failed_at < 10, "host 2 failed only after the last step"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, 11))
    assert "host agent tcp:10.77.0.3:7100 is unreachable" in out
    assert "replica 1 is down" in out
