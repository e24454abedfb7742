"""``controller.malloc`` in real processes: actor processes keep freed memory instead of
faulting it in again.

In a child started with ``controller._local.worker_env``: with the settings, a
200 MB buffer written, freed and allocated again takes no page faults the second time; with
``FORGE_MALLOC=0`` (glibc's defaults: its own mmap, unmapped when freed) every page faults
again.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from controller._local import worker_env
from controller.malloc import NAME, tuned_env

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)

REUSE = textwrap.dedent(
    """
    import ctypes, json, resource
    n = 200 << 20
    faults = []
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buf = ctypes.create_string_buffer(n)
        ctypes.memset(buf, 1, n)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del buf
    print(json.dumps(faults))
    """
)


def _faults(env: dict[str, str]) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", REUSE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


@glibc
def test_an_actor_process_reuses_freed_memory_without_faults():
    env = {k: v for k, v in os.environ.items() if k != NAME}
    first, second = _faults(worker_env(env))
    assert first > 40_000  # 200 MB of 4 KiB pages touched once
    assert second < 1_000, f"freed memory faulted in again: {second} faults"
    first, second = _faults(worker_env({**env, "FORGE_MALLOC": "0"}))
    assert second > 40_000, f"glibc's defaults should unmap and fault again, got {second}"


@glibc
def test_a_command_starts_itself_again_with_the_settings():
    code = textwrap.dedent(
        """
        import os
        print(os.getpid(), os.environ.get("GLIBC_TUNABLES", ""), flush=True)
        from controller.malloc import reexec_tuned
        reexec_tuned()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != NAME}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 2, out  # the second line is the same process after the exec
    (pid1, before), (pid2, after) = (line.split(" ", 1) for line in out)
    assert pid1 == pid2 and before == ""
    assert after == tuned_env({})[NAME]
