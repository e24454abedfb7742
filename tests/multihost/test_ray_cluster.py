"""Forge on a Ray cluster of hosts that share nothing but a network (slow suite, needs root).

Three simulated hosts (``tests/multihost/cluster.py``: a network namespace and private
``/dev/shm`` and ``/tmp`` each, a Ray worker node in each), the Ray head and the controller in
the root namespace. Run: ``python -m pytest -q -m multihost tests/multihost/test_ray_cluster.py``
as root.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'forge[ray]')")

from tests.helpers import REPO, pid_alive, script_env, wait_dead, write_script  # noqa: E402
from tests.multihost import cluster as ray_cluster  # noqa: E402
from tests.multihost import netns  # noqa: E402
from tests.multihost.conftest import _lock  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

HOSTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The head and three hosts, for the whole module (hosts a test killed are restarted)."""
    why = netns.unavailable_reason()
    if why:
        pytest.skip(why)
    fd = _lock()
    try:
        with ray_cluster.running_cluster(HOSTS, tmp_path_factory.mktemp("ray-logs")) as c:
            yield c
    finally:
        os.close(fd)


@pytest.fixture
def hosts(cluster):
    """The cluster with every host's node up (restarting those an earlier test killed);
    afterwards no Forge worker may be left on any host."""
    alive = ray_cluster.alive_node_ips(cluster)
    for h in cluster.hosts:
        if h.ip not in alive:
            cluster.link(h, True)
            netns.kill_host(h.ns)
            cluster.start_node(h)
    yield cluster
    deadline = time.monotonic() + 30
    while (left := _forge_workers(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Forge workers left on the hosts after the test: {left}"


def _forge_workers(cluster) -> dict[str, list[int]]:
    out = {}
    for h in cluster.hosts:
        pids = [p for p in netns.ns_pids(h.ns) if b"controller._worker" in _cmdline(p)]
        if pids:
            out[h.ns] = pids
    return out


def host_of(pid: int) -> str:
    """The namespace (``forgeh<i>``) a process runs in, ``""`` for the root namespace."""
    for ns in netns.namespaces():
        if pid in netns.ns_pids(ns):
            return ns
    return ""


def in_host(ns: str, *cmd: str) -> str:
    """Run ``cmd`` inside host ``ns``'s mounts (its private /dev/shm and /tmp)."""
    raylet = [p for p in netns.ns_pids(ns) if b"raylet" in _cmdline(p)]
    assert raylet, f"no raylet in {ns}"
    out = subprocess.run(
        ["nsenter", "-t", str(raylet[0]), "-m", *cmd], capture_output=True, text=True, timeout=30
    )
    return out.stdout


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _run(tmp_path: Path, cluster, args: list[str], resume: bool = False) -> subprocess.Popen:
    """``forge run`` of the CPU demo (or ``--resume`` of it) on the cluster, in the background."""
    run = tmp_path / "run"
    where = (
        ["--resume", str(run)]
        if resume
        else ["--config", str(REPO / "apps/sumdigits/cpu.yaml"), "--run-dir", str(run)]
    )
    log = open(tmp_path / "run.log", "a")  # noqa: SIM115 - the process owns it
    return subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", *where, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"), **cluster.env()),
    )


def _steps(run: Path) -> list[dict]:
    metrics = run / "rl" / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "train/loss" in r]


def _until_step(proc: subprocess.Popen, run: Path, step: int, timeout: float) -> None:
    """Wait until the run has trained ``step`` steps and is still running (asserted)."""
    deadline = time.monotonic() + timeout
    while len(_steps(run)) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before step {step}"
    assert len(_steps(run)) >= step, f"the run did not reach step {step} within {timeout:.0f} s"


def _placement(run: Path) -> dict[str, set[str]]:
    """Which hosts each mesh or service of the run's status runs on."""
    status = json.loads((run / "status.json").read_text())
    out: dict[str, set[str]] = {}
    for m in status["meshes"]:
        out[m["name"].rsplit("-", 1)[0]] = {host_of(r["pid"]) for r in m["ranks"]}
    for s in status["services"]:
        out[s["name"]] = {host_of(p) for r in s["replicas"] for p in r["pids"]}
    return out


def _summary(log: str) -> dict[str, float]:
    line = [x for x in log.splitlines() if x.startswith("heldout_accuracy=")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}


SERVICES = """
import asyncio, json, os, signal, time
from controller import shutdown
from tests.integration.controller.service_actors import Caller, Echo

async def main():
    svc = await Echo.options(num_replicas=3).as_service()
    out = {"pids": [r.mesh.pids[0] for r in svc.replicas]}
    out["ips"] = [r.mesh._infos[0].address.split(":")[1] for r in svc.replicas]
    out["echo"] = [await svc.echo.route(i) for i in range(12)]
    caller = await Caller.as_actor()
    await caller.keep.call_one(svc)  # a pickled handle, in a worker on some host
    victim = svc.replicas[0]
    old = victim.mesh.pids[0]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (victim.state != "healthy" or victim.mesh.pids[0] == old) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    out["restarted"] = victim.mesh.pids[0]
    deadline = time.monotonic() + 30  # the ref learns of it from the controller's home
    while out["restarted"] not in set(await caller.fanout_pids.call_one()):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    out["seen_by_ref"] = sorted(await caller.fanout_pids.call_one())
    from controller import _wire  # a peer without the session key is refused
    try:
        await _wire.open_channel(svc.replicas[2].mesh._infos[0].address, os.urandom(32),
                                 lambda *a: None, None, timeout=5)
        out["wrong_key"] = "accepted"
    except (ConnectionError, OSError) as e:
        out["wrong_key"] = str(e)
    print("RESULT", json.dumps(out), flush=True)
    await shutdown()

asyncio.run(main())
"""


def _script(tmp_path: Path, cluster, code: str, timeout: float = 300):
    return subprocess.run(
        [sys.executable, str(write_script(tmp_path, code))],
        capture_output=True,
        text=True,
        env=script_env(**cluster.env()),
        cwd=REPO,
        timeout=timeout,
    )


def test_services_spread_one_per_host_and_refs_follow_restarts(hosts, tmp_path):
    out = _script(tmp_path, hosts, SERVICES)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert r["echo"] == list(range(12))
    assert sorted(r["ips"]) == sorted(h.ip for h in hosts.hosts)  # one replica per host
    assert r["restarted"] not in r["pids"]
    assert r["restarted"] in r["seen_by_ref"], r  # the pickled handle saw the restart
    assert "rejected our credentials" in r["wrong_key"], r["wrong_key"]  # wrong Forge key


RELAY = """
import asyncio, json, os, signal, subprocess
from controller import shutdown
from tests.multihost.actors import Relayer

def shape(ips, rate):  # each host's outgoing link limited to `rate` (tc tbf), or unlimited
    for ip in ips:
        ns = "forgeh%d" % (int(ip.rsplit(".", 1)[1]) - 1)
        cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "del" if rate is None else "replace",
               "dev", "eth0", "root"]
        if rate is not None:
            cmd += ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
        subprocess.run(cmd, check=rate is not None, capture_output=True)

async def main():
    svc = await Relayer.options(num_replicas=3).as_service()
    pusher, a, b = [r.mesh for r in svc.replicas]
    info = [await n.where.call_one() for n in (pusher, a, b)]
    out = {"ips": [i["ip"] for i in info]}
    h1 = await pusher.push.call_one(1, 48)
    out["size"] = await pusher.file_size.call_one(h1.location)
    out["src"] = await pusher.sha.call_one(h1.location)
    out["pulls"] = await asyncio.gather(a.pull.call_one(h1), b.pull.call_one(h1))
    out["served_by_pusher"] = await pusher.served.call_one(h1.location)
    # the host that joined second relays from the first: kill the first mid-copy
    h2 = await pusher.push.call_one(2, 96)
    out["src2"] = await pusher.sha.call_one(h2.location)
    out["size2"] = await pusher.file_size.call_one(h2.location)
    # ~5 MB/s a link: the copy takes ~20 s, so the first host is still copying when the second
    # gets its first chunk even on a loaded machine (at 80mbit a CI run saw the first finish)
    shape(out["ips"], "40mbit")
    try:
        first = asyncio.ensure_future(a.pull.call_one(h2))
        await asyncio.sleep(0.5)
        second = asyncio.ensure_future(b.pull.call_one(h2))
        for _ in range(600):  # until the second host has a chunk from the first
            if await b.received.call_one(h2) > 0:
                break
            await asyncio.sleep(0.1)
        os.kill(info[1]["pid"], signal.SIGKILL)
        out["after_kill"] = await asyncio.wait_for(second, 120)
        try:
            await first
            out["first"] = "finished"
        except Exception as e:
            out["first"] = type(e).__name__
    finally:
        shape(out["ips"], None)
    print("RESULT", json.dumps(out), flush=True)
    await shutdown()

asyncio.run(main())
"""


def test_weights_relay_host_to_host_and_survive_a_dead_relay(hosts, tmp_path):
    out = _script(tmp_path, hosts, RELAY)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert len(set(r["ips"])) == 3, r["ips"]
    first, second = sorted(r["pulls"], key=lambda p: p["from_parent"])
    assert first["sha"] == second["sha"] == r["src"]  # both hosts hold the pushed bytes
    # a chain: one host copied from the pusher, the other from that host, all of it
    assert first["from_parent"] == 0 and first["parent"] != second["parent"]
    assert second["from_parent"] == r["size"], r["pulls"]
    assert r["served_by_pusher"] == r["size"], r  # the pusher's link carried each byte once
    k = r["after_kill"]
    assert k["sha"] == r["src2"], k  # the orphan finished from the pusher, bit-exact
    assert 0 < k["from_parent"] < r["size2"], k  # part from the killed host, the rest not
    # (the killed host's own copy may have finished before it died, on a loaded machine: a CI
    # run saw that; what this test is about is the orphan's copy, checked above)


MESH = """
import asyncio, json
from controller import shutdown
from tests.multihost.actors import Where

async def main():
    m = await Where.options(hosts=2, env_vars={"GLOO_SOCKET_IFNAME": "eth0"}).as_actor()
    where = (await m.where.call()).values()
    other, x = await m.slice(hosts=0).call_other.call_one(m.slice(hosts=1), 7)
    reduced = (await m.all_reduce.call(1.5)).values()
    print("RESULT", json.dumps({"where": where, "other": other, "reduced": reduced}), flush=True)
    await shutdown()

asyncio.run(main())
"""


def test_a_mesh_over_two_hosts_calls_across_and_all_reduces(hosts, tmp_path):
    out = _script(tmp_path, hosts, MESH)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    ips = [w["ip"] for w in r["where"]]
    assert len(set(ips)) == 2 and set(ips) <= {h.ip for h in hosts.hosts}  # STRICT_SPREAD
    assert {w["master"] for w in r["where"]} == {ips[0]}  # MASTER_ADDR is rank 0's host
    assert r["other"]["ip"] == ips[1]  # worker to worker, across hosts
    assert r["reduced"] == [3.0, 3.0]  # gloo across hosts


def _generator_replicas(run: Path) -> list[dict]:
    status = json.loads((run / "status.json").read_text())
    return next(s for s in status["services"] if s["name"] == "Generator")["replicas"]


def test_cpu_demo_learns_on_three_hosts_and_loses_nothing_when_a_host_dies(hosts, tmp_path):
    """The CPU demo (150 GRPO steps, as the one-host slow test) with 3 generator replicas (one
    per host) and 2 reward replicas; weights reach each generator host once. At step 20 every
    process of a generator host (not the trainer's) is SIGKILLed: the lost replica comes back on
    a live host (timed), every step completes, every replica ends serving the latest version,
    no request fails, and the run still reaches its accuracy target; checkpoints reach the run
    directory on the controller's host. (One run for both claims: learning on three hosts and a
    host's death, 2 minutes of CI instead of 4.)"""
    steps = 150
    proc = _run(
        tmp_path,
        hosts,
        [
            f"rl.steps={steps}",
            "rl.eval.every=0",  # as the one-host test
            "rl.replicas.generator=3",
            "rl.replicas.rewards=2",
            "rl.checkpoint_every=50",
        ],
    )
    run = tmp_path / "run"
    try:
        _until_step(proc, run, 20, 600)
        where = _placement(run)  # while the processes live
        shm = {h.ns: in_host(h.ns, "ls", "/dev/shm") for h in hosts.hosts}
        victim = next(
            h
            for h in hosts.hosts
            if h.ns not in where["Trainer"] | where["DatasetActor"] | where["ReplayBuffer"]
        )
        lost = [
            r["index"]
            for r in _generator_replicas(run)
            if {host_of(p) for p in r["pids"]} == {victim.ns}
        ]
        assert lost, f"no generator replica on {victim.ns}: {where}"
        t0 = time.monotonic()
        netns.kill_host(victim.ns)
        back = None
        while proc.poll() is None and time.monotonic() - t0 < 120:
            reps = {r["index"]: r for r in _generator_replicas(run)}
            if all(reps[i]["state"] == "healthy" and reps[i]["restarts"] >= 1 for i in lost):
                back = time.monotonic() - t0
                moved = {host_of(p) for i in lost for p in reps[i]["pids"]}
                break
            time.sleep(0.2)
        assert back is not None, f"the lost replicas {lost} did not come back within 120 s"
        assert victim.ns not in moved and "" not in moved, moved
        rc = proc.wait(timeout=850)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-4000:]
    assert [r["step"] for r in _steps(run)] == list(range(1, steps + 1))  # no step lost
    status = json.loads((run / "status.json").read_text())
    versions = status["extra"]["rl"]["generator_versions"]
    assert set(versions.values()) == {steps}, versions
    counts = next(s for s in status["services"] if s["name"] == "Generator")["requests"]
    print(f"generator requests: {counts}")
    # none reached the caller as an error; those on the lost host (if any were in flight at
    # the kill: 0 in one CI run, 5 in another) were re-sent elsewhere
    assert counts["failed"] == 0, counts
    assert counts["completed"] + counts["cancelled"] == counts["sent"], counts  # none in flight
    print(f"host {victim.ns} SIGKILLed: replicas {lost} serving again on {moved} in {back:.1f} s")
    # A hang detector, not a speed claim: 17-30 s measured (30.1 s with the machine at load 5);
    # the figure is printed above and reported in docs/multihost.md.
    assert back < 90, back
    s = _summary(log)
    # the thresholds of tests/e2e/apps/test_chaos.py (the spread: docs/benchmarks.md)
    assert s["heldout_accuracy"] >= s["sft_accuracy"] + 0.10 and s["heldout_accuracy"] >= 0.85, s
    assert where["Generator"] == {h.ns for h in hosts.hosts}, where
    assert len(where["RewardActor"]) == 2 and "" not in where["Trainer"], where
    trainer_host = next(iter(where["Trainer"]))
    for h in hosts.hosts:  # a relayed copy on the host's own /dev/shm, the pushed file on one
        want = "forge-w-" if h.ns == trainer_host else "forge-w-relay-"
        assert want in shm[h.ns], (h.ns, shm[h.ns])
    assert (run / "rl" / "checkpoints" / "latest").exists()
    latest = json.loads((run / "rl" / "checkpoints" / "latest").read_text())["dir"]
    assert (run / "rl" / "checkpoints" / latest / "trainer" / "model.safetensors").exists()


def test_the_trainer_host_dying_stops_the_run_which_resumes(hosts, tmp_path):
    steps = 30
    args = [f"rl.steps={steps}", "sft.steps=20", "rl.eval.every=0", "rl.checkpoint_every=5"]
    proc = _run(tmp_path, hosts, args)
    run = tmp_path / "run"
    try:
        _until_step(proc, run, 12, 400)
        trainer_host = next(iter(_placement(run)["Trainer"]))
        netns.kill_host(trainer_host)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "run.log").read_text()
    assert rc != 0, log[-3000:]
    # that host holds the run's single actors: whichever death is seen first is named
    assert re.search(r"the run's (trainer|buffer|data) died", log), log[-3000:]
    assert "forge run --resume" in log, log[-3000:]
    for h in hosts.hosts:  # bring the dead host back for the resumed run
        if h.ns == trainer_host:
            hosts.start_node(h)
    again = _run(tmp_path, hosts, [], resume=True)
    rc = again.wait(timeout=600)
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-3000:]
    assert "[forge] resumed from" in log
    assert [r["step"] for r in _steps(run)][-1] == steps


LINK_DOWN = """
import asyncio, json, subprocess, time
from controller import shutdown
from tests.integration.controller.service_actors import Echo

async def main():
    svc = await Echo.options(num_replicas=3).as_service()
    victim = svc.replicas[1]
    ip = victim.mesh._infos[0].address.split(":")[1]
    veth = "fgh" + str(int(ip.rsplit(".", 1)[1]) - 1)
    calls = [asyncio.ensure_future(svc.echo.route(i, delay=0.5)) for i in range(60)]
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)  # nothing is killed
    answers = await asyncio.wait_for(asyncio.gather(*calls), 120)
    answered_s = time.monotonic() - t0
    while not (victim.state == "healthy" and victim.mesh._infos[0].address.split(":")[1] != ip):
        assert time.monotonic() - t0 < 120, "no replacement within 120 s"
        await asyncio.sleep(0.1)
    back_s = time.monotonic() - t0
    new_ip = victim.mesh._infos[0].address.split(":")[1]
    print("RESULT", json.dumps({"answers": answers, "answered_s": answered_s, "back_s": back_s,
                                "ip": ip, "new_ip": new_ip}), flush=True)
    subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    await shutdown()

asyncio.run(main())
"""


def test_a_silent_host_is_detected_and_failed_over_within_the_bound(hosts, tmp_path):
    """Take one host's link down without killing anything: its calls are re-sent and a
    replacement serves within 20 s (Ray's health check declares the node dead in ~6 s)."""
    out = _script(tmp_path, hosts, LINK_DOWN)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert r["answers"] == list(range(60))  # no call lost
    assert r["new_ip"] != r["ip"]
    print(
        f"silent host: calls answered in {r['answered_s']:.1f} s, replacement serving in "
        f"{r['back_s']:.1f} s"
    )
    assert r["back_s"] < 20, r


ONE_REPLICA = """
import asyncio, json, time
from controller import shutdown
from tests.multihost import netns
from tests.integration.controller.service_actors import Echo

async def main():
    svc = await Echo.options(num_replicas=1).as_service()  # the default options
    r = svc.replicas[0]
    ip = r.mesh._infos[0].address.split(":")[1]
    call = asyncio.ensure_future(svc.echo.route("in flight", delay=2.0))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    netns.kill_host("forgeh%d" % (int(ip.rsplit(".", 1)[1]) - 1))  # every process of the host
    answer = await asyncio.wait_for(call, 120)
    answered_s = time.monotonic() - t0
    new_ip = r.mesh._infos[0].address.split(":")[1]
    after = await svc.echo.route("after")
    print("RESULT", json.dumps({"answer": answer, "after": after, "answered_s": answered_s,
                                "ip": ip, "new_ip": new_ip, "counts": svc.request_counts(),
                                "restarts": r.restarts}), flush=True)
    await shutdown()

asyncio.run(main())
"""


def test_a_one_replica_service_survives_the_loss_of_its_host(hosts, tmp_path):
    """The host of a service's only replica is SIGKILLed with a request in flight: the request
    waits for the replica the service restarts on another host and is answered there (no
    request lost); closing the run after it raises nothing about the dead host's ranks."""
    out = _script(tmp_path, hosts, ONE_REPLICA)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert (r["answer"], r["after"]) == ("in flight", "after")
    assert r["new_ip"] != r["ip"] and r["restarts"] == 1, r
    assert r["counts"] == {"sent": 2, "retried": 1, "completed": 2, "failed": 0, "cancelled": 0}
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    print(
        f"one-replica service: host killed, request answered on {r['new_ip']} after "
        f"{r['answered_s']:.1f} s"
    )


def test_wrong_ray_token_is_refused(hosts, tmp_path):
    script = write_script(
        tmp_path,
        """
        import asyncio
        from tests.multihost.actors import Where

        async def main():
            await Where.as_actor()

        asyncio.run(main())
    """,
    )
    env = script_env(**{**hosts.env(), "RAY_AUTH_TOKEN": "0" * 32})
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode != 0
    err = out.stdout + out.stderr
    assert "could not join the Ray cluster at RAY_ADDRESS=" in err, err[-2000:]
    assert "auth" in err.lower(), err[-2000:]


CONTROLLER = """
import asyncio
from tests.integration.controller.service_actors import Echo

async def main():
    svc = await Echo.options(num_replicas=3).as_service()
    print("PIDS", *(r.mesh.pids[0] for r in svc.replicas), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_sigkilled_controller_leaves_no_forge_process_on_any_host(hosts, tmp_path):
    before = {h.ns: set(netns.ns_pids(h.ns)) for h in hosts.hosts}
    proc = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, CONTROLLER))],
        stdout=subprocess.PIPE,
        text=True,
        env=script_env(**hosts.env()),
        cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]
        assert {host_of(p) for p in pids} == {h.ns for h in hosts.hosts}
        assert all(pid_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(10)
    assert wait_dead(pids, 30.0) == []
    deadline = time.monotonic() + 30
    while True:  # only the Ray node's own processes remain (its idle worker pool may vary)
        extra = {
            h.ns: [p for p in set(netns.ns_pids(h.ns)) - before[h.ns] if b"_worker" in _cmdline(p)]
            for h in hosts.hosts
        }
        if not any(extra.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(extra.values()), extra
