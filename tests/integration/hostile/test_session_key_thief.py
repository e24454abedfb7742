"""A process of the same user watches a controller's descendants from the moment each appears
(``key_thief.py``: every ``/proc/<pid>/fd/<n>`` it can open, every ``/proc/<pid>/mem`` it can
read) while the controller starts actor processes every way it can: plain (``Popen``), from a
fresh zygote, and from the zygote forked from the controller itself (``controller._prefork``).
The secret passes through the zygotes (the descriptor it comes through, on its way to each
child). The thief must never obtain it.

As root, both the controller and the thief run without ``CAP_SYS_PTRACE`` (dropped from the
bounding set before they start), so that the kernel treats the thief as any same-user process:
root with that capability reads every process, and no protection applies (docs/security.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

from controller.malloc import tuned_env
from tests.helpers import REPO, script_env, wait_dead, write_script

ROUNDS = 3  # x 3 ways x 2 processes: 18 starts watched
WAYS = ("plain", "fresh", "preforked")

# Drop CAP_SYS_PTRACE from the bounding set (prctl PR_CAPBSET_DROP), then exec: root's new
# program then holds every capability but that one. Not root: nothing to drop (EPERM).
WITHOUT_PTRACE = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(24, 19, 0, 0, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)

CONTROLLER = """
import asyncio, json, os, sys
from controller import Actor, _zygote, endpoint, shutdown
from controller._prefork import prefork
from controller._runtime import get_runtime

WAYS = {
    "plain": {},  # nothing to preload: subprocess.Popen
    "fresh": {"FORGE_PRELOAD": "json", "KEY_THIEF_FRESH": "1"},  # a zygote of its own
    "preforked": {"FORGE_PRELOAD": "json"},  # the zygote forked from this process
}


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


async def main():
    forked = prefork(WAYS["preforked"])  # as `forge run` does: before the runtime exists
    key = get_runtime().session.authkey.hex()
    print("KEY", key, int(forked), flush=True)
    sys.stdin.readline()  # the thief is watching
    pids = {way: [] for way in WAYS}
    for _ in range(ROUNDS):
        for way, env in WAYS.items():
            mesh = await Echo.options(procs=2, env_vars=env).as_actor()
            pids[way] += (await mesh.pid.call()).values()
            await asyncio.sleep(0.5)  # time for the thief's slowest round
            await mesh.shutdown()
    pids["zygotes"] = [z.popen.pid for z in _zygote._zygotes.values()]
    print("STARTED", json.dumps(pids), flush=True)
    sys.stdin.readline()  # the thief has stopped
    await shutdown()

asyncio.run(main())
"""


def _without_ptrace(*argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WITHOUT_PTRACE, *argv], **kw)


def test_a_same_user_process_never_obtains_the_session_key(tmp_path):
    script = write_script(tmp_path, CONTROLLER.replace("ROUNDS", str(ROUNDS)))
    controller = _without_ptrace(
        str(script),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=tuned_env(script_env(FORGE_PREFORK="1")),  # as `forge run` starts (malloc)
    )
    thief = None
    try:
        _, key, forked = controller.stdout.readline().split()
        assert forked == "1", "no zygote was forked from the controller: half the check is gone"
        (tmp_path / "key").write_text(key)
        stop, report = tmp_path / "stop", tmp_path / "report.json"
        thief = _without_ptrace(
            str(REPO / "tests/integration/hostile/key_thief.py"),
            str(controller.pid),
            str(tmp_path / "key"),
            str(stop),
            str(report),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert thief.stdout.readline().strip() == "watching"
        controller.stdin.write("go\n")
        controller.stdin.flush()
        word, started = controller.stdout.readline().split(" ", 1)
        assert word == "STARTED", word
        pids = json.loads(started)
        stop.touch()
        thief.wait(30)
        seen = json.loads(report.read_text())
        controller.stdin.write("done\n")
        controller.stdin.flush()
        assert controller.wait(60) == 0
    finally:
        for p in (thief, controller):
            if p is not None and p.poll() is None:
                p.kill()
        wait_dead([p.pid for p in (thief, controller) if p is not None], 10)
    assert len(pids["zygotes"]) == 2 and all(len(pids[w]) == ROUNDS * 2 for w in WAYS), pids
    procs = {int(pid): p for pid, p in seen["procs"].items()}
    missed = {p for w in (*WAYS, "zygotes") for p in pids[w]} - procs.keys()
    assert not missed, f"the thief never saw {missed}: it proves nothing"
    opened = [p for p in pids["plain"] if procs[p]["last_open"] is not None]
    assert opened, "the thief never got into a starting plain worker: it proves nothing"
    assert seen["found"] == [], f"a same-user process obtained the secret: {seen}; {pids}"
    # A zygote is closed to it before it forks its first child (it starts as any process
    # does, holding nothing yet), and the workers it forks are closed from their first moment.
    # (A plain worker is open until it makes itself non-dumpable, with nothing in it yet.)
    for z in pids["zygotes"]:
        children = [p for p in procs.values() if p["ppid"] == z]
        assert children, f"no child of zygote {z} was seen"
        assert all(c["last_open"] is None for c in children), (z, children)
        last_open = procs[z]["last_open"]
        first_child = min(c["first_seen"] for c in children)
        assert last_open is None or last_open < first_child, (z, procs[z], first_child)
