"""The status file behind ``forge top``: atomic writes, final states, the RL fields and the
rendered frame (the command line, ``forge top --once``: tests/e2e/apps/test_top_once.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time

import pytest
from rich.console import Console

from controller.status import StatusWriter, set_status_field
from forge.cli.top import find_status_file, load_status, render
from forge.observability.status import StepStatus, run_status


def _text(renderable, width: int = 160) -> str:
    console = Console(record=True, width=width, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


# Above Linux's PID_MAX_LIMIT (2**22): no process ever has this pid.
NO_SUCH_PID = 2**22 + 1


def test_readers_never_see_half_a_file(tmp_path):
    set_status_field("big", "x" * 200_000)  # big enough that a plain write is not one syscall
    writer = StatusWriter(tmp_path / "status.json", interval_s=0.002).start()
    reads, bad, stop = [0], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                json.loads((tmp_path / "status.json").read_text())
                reads[0] += 1
            except json.JSONDecodeError as e:
                bad.append(e)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.5)
    stop.set()
    t.join()
    writer.finish("finished")
    set_status_field("big", None)
    assert bad == [] and reads[0] > 20 and writer.writes > 20
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left


def test_run_status_marks_finished_crashed_and_interrupted(tmp_path):
    for name in ("ok", "crash", "stop"):
        (tmp_path / name).mkdir()
    with run_status(tmp_path / "ok", app="apps.x"):
        assert load_status(tmp_path / "ok" / "status.json")["state"] == "running"
    ok = load_status(tmp_path / "ok" / "status.json")
    assert (ok["state"], ok["error"], ok["info"]) == ("finished", None, {"app": "apps.x"})

    def inner():
        raise RuntimeError("reward service gave up\nsecond line")

    with pytest.raises(RuntimeError), run_status(tmp_path / "crash"):
        inner()
    crash = load_status(tmp_path / "crash" / "status.json")
    assert crash["state"] == "crashed"
    assert crash["error"] == "RuntimeError: reward service gave up"
    assert "in inner" in crash["traceback"] and "second line" in crash["traceback"]

    with pytest.raises(asyncio.CancelledError), run_status(tmp_path / "stop"):
        raise asyncio.CancelledError()
    assert load_status(tmp_path / "stop" / "status.json")["state"] == "interrupted"


def test_writer_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="interval_s"):
        StatusWriter(tmp_path / "s.json", interval_s=0)
    with pytest.raises(ValueError, match="is missing"):
        StatusWriter(tmp_path / "nope" / "s.json").start()
    w = StatusWriter(tmp_path / "s.json").start()
    with pytest.raises(ValueError, match="finish state"):
        w.finish("done")
    w.finish("finished")


def test_step_status_picks_the_rl_fields():
    st = StepStatus("grpo", steps_total=10)
    metrics = {
        "rollout/reward": 0.5,
        "rollout/reward/exact": 0.25,
        "trainer/busy_fraction": 0.4,
        "generator/busy_fraction": 0.9,
        "replay/size": 64.0,
        "replay/sampled_policy_age_mean": 0.5,
        "replay/sampled_policy_age_max": 1.0,
        "train/loss": 0.125,
        "eval/heldout_accuracy": 0.0,
        "other/thing": 3.0,
    }
    st.step(1, metrics)
    time.sleep(0.05)
    st.step(3, {**metrics, "rollout/reward": 0.75, "eval/heldout_accuracy": float("nan")})
    st.served({0: 3, 1: 2})
    f = st.fields
    assert (f["step"], f["trainer_version"], f["steps_total"]) == (3, 3, 10)
    assert 2 / 1.0 < f["steps_per_s"] < 2 / 0.05
    assert f["rewards"] == {"rollout/reward": 0.75, "rollout/reward/exact": 0.25}
    assert f["reward_history"] == [0.5, 0.75]
    assert f["busy"] == {"trainer": 0.4, "generator": 0.9}
    assert f["buffer"] == {"size": 64.0, "policy_age_mean": 0.5, "policy_age_max": 1.0}
    assert f["train"] == {"train/loss": 0.125}
    assert f["eval"] == {"step": 1, "eval/heldout_accuracy": 0.0}  # NaN is not a result
    assert f["generator_versions"] == {"0": 3, "1": 2}
    json.dumps(f)
    # A step whose row lacks the actors' metrics (they arrive off the critical path) keeps
    # the last values shown instead of blanking those rows.
    st.step(4, {"train/loss": 0.0625})
    assert f["step"] == 4 and f["train"] == {"train/loss": 0.0625}
    assert f["rewards"] == {"rollout/reward": 0.75, "rollout/reward/exact": 0.25}
    assert f["busy"] == {"trainer": 0.4, "generator": 0.9}
    assert f["reward_history"] == [0.5, 0.75]


def status_snapshot(**over) -> dict:
    """A running GRPO run's ``status.json`` (tests/e2e/apps/test_top_once.py uses it too)."""
    now = time.time()
    snap = {
        "format": 1,
        "state": "running",
        "error": None,
        "traceback": None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": now - 125,
        "updated_at": now,
        "interval_s": 1.0,
        "info": {"app": "apps.sumdigits.main"},
        "meshes": [
            {
                "name": "Trainer-3",
                "sizes": {"procs": 2},
                "ranks": [
                    {"rank": 0, "pid": 101, "alive": True, "exit": None},
                    {"rank": 1, "pid": 102, "alive": False, "exit": "killed by SIGKILL"},
                ],
            }
        ],
        "services": [
            {
                "name": "Generator",
                "actor": "Generator",
                "max_concurrent": 10,
                "replicas": [
                    {
                        "index": 0,
                        "state": "healthy",
                        "pids": [201],
                        "in_flight": 4,
                        "queued": 2,
                        "restarts": 0,
                        "last_error": None,
                        "requests_total": 17,
                        "requests_failed": 0,
                        "latency_p50_ms": 12.5,
                        "latency_p99_ms": 40.0,
                    },
                    {
                        "index": 1,
                        "state": "recovering",
                        "pids": [202],
                        "in_flight": 0,
                        "queued": 0,
                        "restarts": 1,
                        "last_error": "process died: SIGKILL",
                        "requests_total": 9,
                        "requests_failed": 1,
                        "latency_p50_ms": None,
                        "latency_p99_ms": None,
                    },
                ],
            }
        ],
        "extra": {
            "rl": {
                "stage": "grpo",
                "step": 45,
                "steps_total": 500,
                "steps_per_s": 0.5,
                "trainer_version": 45,
                "generator_versions": {"0": 45, "1": 43},
                "rewards": {"rollout/reward": 0.531},
                "reward_history": [0.1, 0.3, 0.531],
                "busy": {"trainer": 0.41},
                "buffer": {"size": 96.0},
                "train": {"train/loss": 0.0123},
                "eval": {"step": 0, "eval/heldout_accuracy": 0.375},
            }
        },
    }
    snap.update(over)
    return snap


def test_frame_shows_progress_versions_services_and_meshes():
    text = _text(render(status_snapshot(), "runs/demo/status.json"))
    for want in (
        "apps.sumdigits.main",
        "RUNNING",
        "up 2m05s",
        "step 45/500",
        "9%",
        "0.50 steps/s",
        "ETA 15m10s",
        "trainer v45",
        "generator r1 v43 (2 behind)",
        "mean 0.531",
        "heldout_accuracy 0.375",
        "size 96",
        "trainer",
        "41%",
        "Generator",
        "recovering",
        "process died: SIGKILL",
        "Trainer-3",
        "1/2 (rank 1: killed by SIGKILL)",
    ):
        assert want in text, (want, text)


def test_frame_shows_the_headline_of_named_eval_sets():
    snap = status_snapshot()
    snap["extra"]["rl"]["eval"].update(
        {
            "eval/chain/pass@1": 0.25,
            "eval/chain/pass@4": 0.5,
            "eval/chain/reward": 0.3,
            "eval/chain/tasks": 64.0,
            "eval/chain/finish/stop": 1.0,
        }
    )
    text = _text(render(snap, "r/status.json"))
    assert "chain/pass@1 0.250" in text and "chain/pass@4 0.500" in text, text
    assert "chain/reward 0.300" in text and "chain/tasks" not in text and "finish" not in text


def test_frame_shows_the_host_of_ranks_on_other_hosts():
    """On the Ray backend ranks listen on TCP: their pids are shown with their host."""
    snap = status_snapshot()
    snap["meshes"][0]["ranks"][0]["host"] = "10.77.0.2"
    snap["services"][0]["replicas"][0]["hosts"] = ["10.77.0.3"]
    text = _text(render(snap, "r/status.json"))
    assert "101@10.77.0.2,102" in text and "201@10.77.0.3" in text, text


def test_frame_says_when_a_run_crashed_or_stopped_updating():
    crashed = status_snapshot(state="crashed", error="ActorDiedError: trainer died", traceback="tb")
    text = _text(render(crashed, "r/status.json"))
    assert "CRASHED" in text and "ActorDiedError: trainer died" in text
    stale = status_snapshot(updated_at=time.time() - 60, pid=NO_SUCH_PID)
    text = _text(render(stale, "r/status.json"))
    assert "NOT UPDATING" in text and "is gone" in text and "updated 1m00s ago" in text
    fresh = _text(render(status_snapshot(), "r/status.json"))
    assert "NOT UPDATING" not in fresh


def test_find_status_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FORGE_RUN_DIR", str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="no run directory with a status.json"):
        find_status_file(None)
    for i, name in enumerate(["b-old", "a-new"]):
        (tmp_path / "runs" / name).mkdir(parents=True)
        f = tmp_path / "runs" / name / "status.json"
        f.write_text("{}")
        os.utime(f, (1000 + i, 1000 + i))
    assert find_status_file(None).parent.name == "a-new"
    assert find_status_file(tmp_path / "runs" / "b-old").parent.name == "b-old"
    with pytest.raises(ValueError, match="no such run directory"):
        find_status_file(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a status snapshot"):
        load_status(tmp_path / "runs" / "a-new" / "status.json")
