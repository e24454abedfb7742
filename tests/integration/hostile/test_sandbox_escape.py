"""Model-written code in the tool sandbox tries to leave it: read the session's secret from
its parent actor, outlive ``run_python`` with ``setsid`` and a double fork (or its actor, when
that is SIGKILLed), and fork-bomb.
Real processes; each case asserts the secret is not shown and no process is left behind, with
the PID namespace (where the host allows one) and without it (the subreaper alone)."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import textwrap
import time

import pytest

import forge.envs.sandbox as sandbox
from controller._runtime import get_runtime
from controller.errors import ActorDiedError
from forge.envs import run_python
from tests.helpers import pid_alive, wait_dead
from tests.integration.hostile.sandbox_actors import SandboxHost


@pytest.fixture(params=["namespace", "subreaper"])
def mode(request, monkeypatch):
    monkeypatch.setattr(sandbox, "USE_NAMESPACES", request.param == "namespace")
    return request.param


READ_PARENT = textwrap.dedent(
    """
    import os
    for what in ("environ", "cmdline", "mem"):
        try:
            with open("/proc/WORKER_PID/" + what, "rb") as f:
                data = f.read(1 << 20) if what != "mem" else b""
            print(what, "read", len(data), data.hex())
        except OSError as e:
            print(what, "denied", type(e).__name__)
    """
)


async def test_sandboxed_code_cannot_read_the_session_key(mode):
    host = await SandboxHost.as_actor()
    key = get_runtime().session.authkey.hex()
    seen = await host.exposure.call_one(timeout=30)
    assert "FORGE_SESSION_KEY" not in seen["env_names"]  # not in os.environ ...
    assert key not in seen["environ"]  # ... nor in the initial environment block
    assert seen["dumpable"] == 0  # and /proc/<pid>/environ, mem: not for same-user peers
    out = await host.run.call_one(READ_PARENT, timeout=30)
    assert key not in out["stdout"] and key.encode().hex() not in out["stdout"]
    assert "environ" in out["stdout"], out  # the probe ran
    assert await host.run.call_one("print(6 * 7)", timeout=30) == {
        "stdout": "42\n",
        "stderr": "",
        "exit_code": 0,
    }


SETSID_ESCAPE = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()                     # its own session: out of the sandbox's process group
    if os.fork() == 0:              # and re-parented when its parent exits
        os.write(w, b"x")
        time.sleep(1.5)
        open({marker!r}, "w").write(str(os.getpid()))  # proof it outlived run_python
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.read(r, 1)
print("escaped", flush=True)
"""


def test_setsid_double_fork_does_not_outlive_run_python(tmp_path, mode):
    marker = tmp_path / "alive"
    r = run_python(SETSID_ESCAPE.format(marker=str(marker)), timeout_s=10)
    assert r.stdout == "escaped\n" and r.exit_code == 0, r
    time.sleep(2.5)
    assert not marker.exists(), f"a setsid child outlived run_python ({mode})"


def test_setsid_escape_is_killed_at_the_timeout(tmp_path, mode):
    marker = tmp_path / "alive"
    code = SETSID_ESCAPE.format(marker=str(marker)) + "\nwhile True: pass\n"
    start = time.monotonic()
    r = run_python(code, timeout_s=1.0)
    assert time.monotonic() - start < 3.0
    assert r.timed_out and r.exit_code == -9
    time.sleep(2.0)
    assert not marker.exists()


LINGER = """
import os, time
if os.fork() == 0:
    os.setsid()                     # its own session, and re-parented when its parent exits
    if os.fork() == 0:
        open({marker!r}, "a").write("grandchild\\n")
        time.sleep(120)
    os._exit(0)
open({marker!r}, "a").write(os.getcwd() + "\\n")
time.sleep(120)
"""


def _cwd_in(path: str) -> list[int]:
    """Every process whose working directory is ``path``."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == path:
                found.append(int(pid))
        except OSError:
            pass
    return found


async def test_a_sigkilled_actors_sandboxed_program_ends_and_its_temp_dirs_go(tmp_path, mode):
    """The actor that called run_python dies mid-call (SIGKILL: no finally runs in it): the
    supervisor, the program and a setsid grandchild are gone within seconds, well before the
    program's 60 s limit, and so are the temporary directories."""
    tmp, marker = tmp_path / "tmp", tmp_path / "started"
    tmp.mkdir()
    host = await SandboxHost.options(env_vars={"TMPDIR": str(tmp)}).as_actor()
    code = LINGER.format(marker=str(marker))
    call = asyncio.ensure_future(host.run.call_one(code, 60.0, mode == "namespace"))
    deadline = time.monotonic() + 30
    while len(marker.read_text().split() if marker.exists() else []) < 2:
        assert time.monotonic() < deadline and not call.done(), "the program did not start"
        await asyncio.sleep(0.05)
    workdir = next(line for line in marker.read_text().split() if line != "grandchild")
    tree = _cwd_in(workdir)  # the supervisor, the program, its grandchild
    assert len(tree) >= 3, tree
    assert len(os.listdir(tmp)) == 2  # the working directory and the output's
    os.kill(host.pids[0], signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        await call
    assert wait_dead(tree, 5.0) == [], f"the sandbox outlived its actor ({mode})"
    deadline = time.monotonic() + 5
    while os.listdir(tmp) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert os.listdir(tmp) == [], "the sandbox's temporary directories were left"


FORK_BOMB = """
import os, sys, time
pids = []
try:
    for _ in range({tries}):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
except OSError as e:
    print("fork refused:", e.strerror)
print("forked", len(pids))
print("pids", *pids)
"""


def test_fork_bomb_is_bounded_and_leaves_nothing(mode):
    tries = 300
    r = run_python(FORK_BOMB.format(tries=tries), timeout_s=20, max_procs=32)
    assert r.exit_code == 0, r
    forked = int(r.stdout.split("forked ")[1].split()[0])
    if os.geteuid() != 0:  # RLIMIT_NPROC does not bind root
        assert "fork refused" in r.stdout and forked <= 32, r.stdout
    else:
        assert forked <= tries
    if mode == "subreaper":  # host pids: each must be gone (in a namespace they are not ours)
        pids = [int(p) for p in r.stdout.split("pids")[1].split()]
        time.sleep(0.2)
        assert [p for p in pids if pid_alive(p)] == []


def test_nproc_limit_is_set_relative_to_the_users_processes():
    r = run_python("import resource\nprint(*resource.getrlimit(resource.RLIMIT_NPROC))")
    soft, hard = (int(x) for x in r.stdout.split())
    assert soft == hard and soft != resource.RLIM_INFINITY
    threads = 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/status") as f:
                threads += int(next(ln for ln in f if ln.startswith("Threads:")).split()[1])
        except (OSError, StopIteration):
            pass
    assert threads // 2 <= soft - 64 <= threads + 16  # the user's threads now (all: as root)


def test_max_procs_must_be_positive():
    with pytest.raises(ValueError, match="max_procs"):
        run_python("print(1)", max_procs=0)
