"""The actors' zygote forked from the controller (``controller._prefork``): its children are
the workers a fresh zygote would fork, and it is only used where that holds."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import psutil

from controller._prefork import prefork
from controller.malloc import tuned_env
from tests.helpers import REPO, script_env, wait_dead, write_script

CONTROLLER = """
import asyncio, json, os, sys, time
import torch
from controller import Actor, endpoint, shutdown
from controller._prefork import prefork

ENV = {"FORGE_PRELOAD": "json,numpy,torch", "OMP_NUM_THREADS": "1",
       "TRANSFORMERS_VERBOSITY": "error"}


class Probe(Actor):
    @endpoint
    def facts(self) -> dict:
        import numpy

        return {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
                "preloaded": "torch" in sys.modules, "threads": torch.get_num_threads(),
                "draw": float(numpy.random.random()), "main": sys.modules["__main__"].__spec__.name,
                "path": sys.path, "omp": os.environ.get("OMP_NUM_THREADS")}

    @endpoint
    def unflushed(self, text: str) -> None:
        print(text)  # no flush: unbuffered, as a fresh zygote's child (PYTHONUNBUFFERED)


async def main():
    torch.set_num_threads(2)
    forked = prefork(ENV)
    t0 = time.monotonic()
    probes = await Probe.options(procs=2, env_vars=ENV).as_actor()
    facts = list((await probes.facts.call()).values())
    took = time.monotonic() - t0
    await probes.unflushed.call("unflushed line")
    plain = await Probe.options(procs=1, env_vars={"OMP_NUM_THREADS": "1"}).as_actor()
    other = await Probe.options(procs=1, env_vars={**ENV, "PYTHONHASHSEED": "3"}).as_actor()
    print("FACTS", json.dumps({"forked": forked, "facts": facts, "took": took,
                               "plain": await plain.facts.call_one(),
                               "other": await other.facts.call_one(),
                               "again": prefork(ENV)}), flush=True)
    if "--wait" in sys.argv:
        await asyncio.sleep(300)
    await shutdown()

asyncio.run(main())
"""


def _start(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, CONTROLLER)), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=tuned_env(script_env(FORGE_PREFORK="1")),  # started as `forge run` is (malloc)
    )


def _facts(proc: subprocess.Popen) -> tuple[dict, list[str]]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("FACTS"):
            return json.loads(line[len("FACTS") :]), lines
    raise AssertionError("no FACTS line:\n" + "".join(lines))


def test_children_of_the_forked_zygote_are_the_workers_a_fresh_one_forks(tmp_path):
    proc = _start(tmp_path)
    try:
        r, lines = _facts(proc)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert r["forked"] and not r["again"]  # one zygote per environment
    facts, plain, other = r["facts"], r["plain"], r["other"]
    (zygote,) = {f["ppid"] for f in facts}
    assert zygote != proc.pid and plain["ppid"] == proc.pid  # forked by the copy, not by us
    assert all(f["sid"] == f["pid"] and f["preloaded"] for f in facts)
    assert {f["threads"] for f in facts} == {1}  # OMP_NUM_THREADS applied after the fork ...
    assert plain["threads"] == 1  # ... as a fresh interpreter reads it (the controller has 2)
    assert len({f["draw"] for f in facts}) == 2 and {f["main"] for f in facts} == {
        "controller._worker"
    }
    assert all(set(plain["path"]) <= set(f["path"]) for f in facts), (facts[0], plain["path"])
    assert "unflushed line" in "".join(lines) + rest
    # A name read at start-up that the copy cannot apply: a fresh zygote, not the copy.
    assert other["ppid"] not in (zygote, proc.pid) and other["preloaded"]


def test_the_forked_zygote_and_its_children_end_with_the_controller(tmp_path):
    proc = _start(tmp_path, "--wait")
    try:
        r, _ = _facts(proc)
        zygote = r["facts"][0]["ppid"]
        assert "forge-zygote" in " ".join(psutil.Process(zygote).cmdline())
        pids = [f["pid"] for f in r["facts"]] + [zygote]
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.wait(10)
    assert wait_dead(pids, 5) == []


def test_a_process_with_another_thread_running_is_not_forked(monkeypatch):
    monkeypatch.setenv("FORGE_PREFORK", "1")  # so the thread is the only reason to refuse
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert not prefork({"FORGE_PRELOAD": "json", "OMP_NUM_THREADS": "1"})
    finally:
        stop.set()
        t.join()


def test_a_secret_in_the_environment_zygotes_off_or_another_backend_mean_no_fork(tmp_path):
    code = "from controller._prefork import prefork\nprint(prefork({'FORGE_PRELOAD': 'json'}))\n"
    path = write_script(tmp_path, code)
    for extra, want in (
        ({}, "True"),
        ({"FORGE_SESSION_KEY": "ab" * 32}, "False"),
        ({"FORGE_ZYGOTE": "0"}, "False"),
        ({"FORGE_PREFORK": "0"}, "False"),
        ({"FORGE_BACKEND": "ray"}, "False"),
    ):
        env = tuned_env(script_env(**extra))  # as `forge run` starts (controller.malloc)
        if not extra:
            env.pop("FORGE_PREFORK", None)  # the default forks
        out = subprocess.run(
            [sys.executable, str(path)],
            capture_output=True,
            text=True,
            cwd=str(REPO),
            env=env,
            timeout=60,
        )
        assert out.stdout.strip() == want, (extra, out.stdout, out.stderr)
    # Started without the actors' malloc settings (glibc reads them only at a process's
    # start): a fork would lack them, so a fresh zygote starts with them instead.
    env = script_env()
    env.pop("FORGE_PREFORK", None)
    env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env=env,
        timeout=60,
    )
    assert out.stdout.strip() == "False", (out.stdout, out.stderr)
