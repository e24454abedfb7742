"""Actor processes forked from a zygote (``controller._zygote``): what a mesh whose variables
name modules to preload (``FORGE_PRELOAD``) gets, and what happens when things die."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from controller import Actor, current_rank, endpoint, shutdown, this_host
from controller.errors import ActorDiedError
from tests.helpers import REPO, actor_processes, script_env, wait_dead, write_script

PRELOAD = {"FORGE_PRELOAD": "json,numpy", "OMP_NUM_THREADS": "1"}


class Probe(Actor):
    @endpoint
    def facts(self) -> dict:
        import numpy

        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "leads_session": os.getsid(0) == os.getpid(),
            "rank": str(current_rank().rank),
            "torch_rank": os.environ.get("RANK"),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "preloaded": "numpy" in sys.modules,
            "draw": float(numpy.random.random()),
            "cwd": os.getcwd(),
            "path": sys.path,
            "main": sys.modules["__main__"].__spec__.name,
        }

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def exit_with(self, code: int) -> None:
        os._exit(code)


def _zygotes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if "_zygote.py" in " ".join(p.cmdline())]


async def test_a_preloading_mesh_forks_from_one_zygote_and_is_the_process_it_would_be():
    probes = await Probe.options(procs=3, env_vars=PRELOAD).as_actor()
    facts = (await probes.facts.call()).values()
    (zygote,) = _zygotes()
    assert {f["ppid"] for f in facts} == {zygote.pid}  # forked, not started by us
    assert all(f["leads_session"] and f["preloaded"] for f in facts)
    assert [f["rank"] for f in facts] == ["0", "1", "2"]  # each its own runtime variables
    assert [f["torch_rank"] for f in facts] == ["0", "1", "2"]
    assert {f["omp"] for f in facts} == {"1"}
    assert len({f["draw"] for f in facts}) == 3  # numpy reseeded in each child
    assert {f["main"] for f in facts} == {"controller._worker"}
    # ps shows each as the worker it is, not as the zygote it was forked from
    found = actor_processes(os.getpid(), "Probe")
    assert sorted(found) == sorted(f["pid"] for f in facts), found
    plain = await Probe.options(procs=1, env_vars={"OMP_NUM_THREADS": "1"}).as_actor()
    p = await plain.facts.call_one()  # (no FORGE_PRELOAD: started as python -m)
    assert {f["cwd"] for f in facts} == {p["cwd"]} and p["ppid"] == os.getpid()
    assert all(f["path"] == p["path"] for f in facts), (facts[0]["path"], p["path"])
    # Another mesh with the same import-time variables: the same zygote. Another value of
    # one read at import (OMP_NUM_THREADS): a zygote of its own.
    same = await Probe.options(procs=1, env_vars=PRELOAD).as_actor()
    assert (await same.facts.call_one())["ppid"] == zygote.pid
    other = await Probe.options(procs=1, env_vars={**PRELOAD, "OMP_NUM_THREADS": "2"}).as_actor()
    o = await other.facts.call_one()
    assert o["omp"] == "2" and o["ppid"] != zygote.pid and len(_zygotes()) == 2
    await shutdown()
    assert _zygotes() == []  # shutdown() stops them too


async def test_without_preload_or_with_zygotes_off_processes_start_plain(monkeypatch):
    plain = await Probe.options(procs=1, env_vars={"OMP_NUM_THREADS": "1"}).as_actor()
    assert (await plain.facts.call_one())["ppid"] == os.getpid()
    monkeypatch.setenv("FORGE_ZYGOTE", "0")
    off = await Probe.options(procs=1, env_vars=PRELOAD).as_actor()
    assert (await off.facts.call_one())["ppid"] == os.getpid()
    assert _zygotes() == []


class Preloading(Probe):
    preload = "json,numpy"  # the class names what it imports: no env_vars needed


async def test_an_actor_class_that_names_its_imports_forks_from_a_zygote():
    probes = await Preloading.options(procs=2).as_actor()
    facts = (await probes.facts.call()).values()
    (zygote,) = _zygotes()
    assert {f["ppid"] for f in facts} == {zygote.pid} and all(f["preloaded"] for f in facts)
    plain = await Preloading.options(procs=1, env_vars={"FORGE_PRELOAD": ""}).as_actor()
    assert (await plain.facts.call_one())["ppid"] == os.getpid()  # the options' value wins


async def test_exit_codes_signals_and_output_reach_the_controller(capfd):
    probes = await Probe.options(procs=2, env_vars=PRELOAD).as_actor()
    await probes.say.call("hello from a forked worker")
    pids = [f["pid"] for f in (await probes.facts.call()).values()]
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(ActorDiedError, match="SIGKILL|signal 9|killed"):
        await probes.facts.call()
    procs = await this_host().spawn_procs({"procs": 1}, env_vars=PRELOAD)
    mesh = await procs.spawn("p", Probe)
    with pytest.raises(ActorDiedError, match="exit code 7|code 7"):
        await mesh.exit_with.call_one(7)
    assert "hello from a forked worker" in capfd.readouterr().out


async def test_a_dead_zygote_leaves_its_children_serving_and_their_deaths_still_seen():
    probes = await Probe.options(procs=2, env_vars=PRELOAD).as_actor()
    pids = [f["pid"] for f in (await probes.facts.call()).values()]
    (zygote,) = _zygotes()
    zygote.kill()
    zygote.wait(5)
    assert len((await probes.facts.call()).values()) == 2  # the children live on
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        await probes.facts.call()
    again = await Probe.options(procs=1, env_vars=PRELOAD).as_actor()  # a new zygote
    assert (await again.facts.call_one())["ppid"] != zygote.pid


async def test_a_slow_zygote_start_does_not_stall_the_controller(tmp_path):
    """The first fork of a zygote waits for its imports (torch: seconds); the controller's
    event loop must go on meanwhile (other meshes, heartbeats, progress)."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(3)\n")
    env = {**PRELOAD, "FORGE_PRELOAD": "slow_to_import", "PYTHONPATH": str(tmp_path)}
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.2)  # ticking
    t0 = time.monotonic()
    try:
        probes = await Probe.options(procs=2, env_vars=env).as_actor()
        facts = (await probes.facts.call()).values()
    finally:
        ticker.cancel()
    assert time.monotonic() - t0 >= 3  # the import's wait was really there ...
    assert {f["ppid"] for f in facts} == {_zygotes()[0].pid}
    assert max(gaps) < 1.0, max(gaps)  # ... and the loop ran through it


CONTROLLER = """
import asyncio
from tests.integration.controller.test_zygote import PRELOAD, Probe

async def main():
    p = await Probe.options(procs=2, env_vars=PRELOAD).as_actor()
    facts = (await p.facts.call()).values()
    print("PIDS", " ".join(str(f["pid"]) for f in facts), facts[0]["ppid"], flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_no_orphans_when_the_controller_is_killed(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, CONTROLLER))],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=script_env(),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]  # two workers, then their zygote
        assert psutil.Process(pids[2]).ppid() == proc.pid
    finally:
        proc.kill()
        proc.wait(10)
    assert wait_dead(pids, 5) == []  # the zygote and its children, as plain workers are
