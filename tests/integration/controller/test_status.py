"""The status snapshot of a live runtime: real services and meshes, a replica killed and
restarted, the file ``forge top`` reads rewritten in the background."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

from controller.status import StatusWriter, set_status_field, status_snapshot
from forge.cli.top import render
from tests.helpers import wait_dead
from tests.integration.controller.actors import Counter
from tests.integration.controller.service_actors import Echo


async def _until(cond, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _replicas(snap: dict, name: str) -> list[dict]:
    return [s for s in snap["services"] if s["name"] == name][0]["replicas"]


async def test_snapshot_shows_a_killed_replica_restarting(tmp_path):
    svc = await Echo.options(num_replicas=2, health_poll_rate=0.05).as_service()
    counter = await Counter.options(procs=2).as_actor(0)
    writer = StatusWriter(tmp_path / "status.json", interval_s=0.1, info={"app": "t"}).start()
    try:
        snap = json.loads((tmp_path / "status.json").read_text())
        reps = _replicas(snap, "Echo")
        assert [r["state"] for r in reps] == ["healthy", "healthy"]
        assert all(r["restarts"] == 0 and r["last_error"] is None for r in reps)
        meshes = {m["name"].split("-")[0]: m for m in snap["meshes"]}
        assert "Counter" in meshes
        # the replicas' meshes are listed under their service, not again as meshes (other
        # tests' meshes may still be alive in this process's runtime)
        replica_pids = {p for r in reps for p in r["pids"]}
        listed = {r["pid"] for m in snap["meshes"] for r in m["ranks"]}
        assert not replica_pids & listed
        assert [r["alive"] for r in meshes["Counter"]["ranks"]] == [True, True]
        assert sorted(r["pid"] for r in meshes["Counter"]["ranks"]) == sorted(counter.pids)

        victim = reps[0]["pids"][0]
        os.kill(victim, signal.SIGKILL)
        assert wait_dead([victim], 10) == []

        def restarted():
            s = json.loads((tmp_path / "status.json").read_text())
            r0 = _replicas(s, "Echo")[0]
            return s if r0["restarts"] == 1 and r0["state"] == "healthy" else None

        snap = await _until(restarted)
        r0 = _replicas(snap, "Echo")[0]
        assert victim not in r0["pids"]
        assert str(victim) in r0["last_error"] and "SIGKILL" in r0["last_error"]
        assert await svc.echo.route(3) == 3

        frame = _text(render(snap, tmp_path / "status.json"))
        assert "Echo" in frame and "healthy" in frame and "SIGKILL" in frame
        assert "RUNNING" in frame
    finally:
        writer.finish("finished")
    final = json.loads((tmp_path / "status.json").read_text())
    assert final["state"] == "finished" and final["info"] == {"app": "t"}
    assert writer.writes >= 3


async def test_in_flight_and_queued_come_from_the_controller(tmp_path):
    svc = await Echo.options(num_replicas=1, replica_max_concurrent_requests=2).as_service()
    calls = [asyncio.ensure_future(svc.echo.route(i, delay=1.0)) for i in range(5)]
    try:
        rep = await _until(
            lambda: (r := _replicas(status_snapshot(), "Echo")[0])["queued"] == 3 and r
        )
        assert rep["in_flight"] == 2
    finally:
        assert sorted(await asyncio.gather(*calls)) == [0, 1, 2, 3, 4]
    rep = _replicas(status_snapshot(), "Echo")[0]
    assert (rep["in_flight"], rep["queued"], rep["requests_total"]) == (0, 0, 5)


async def test_dead_mesh_rank_is_shown_with_its_exit(tmp_path):
    counter = await Counter.options(procs=2).as_actor(0)
    pid = counter.pids[1]
    os.kill(pid, signal.SIGKILL)
    assert wait_dead([pid], 10) == []
    m = await _until(
        lambda: [
            m
            for m in status_snapshot()["meshes"]
            if m["name"].startswith("Counter") and not m["ranks"][1]["alive"]
        ]
    )
    assert "SIGKILL" in m[0]["ranks"][1]["exit"] and m[0]["ranks"][0]["alive"]


def test_app_fields_appear_under_extra():
    set_status_field("rl", {"step": 3})
    assert status_snapshot()["extra"]["rl"] == {"step": 3}


def _text(renderable) -> str:
    from rich.console import Console

    console = Console(record=True, width=160, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()
