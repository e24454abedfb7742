"""An actor that runs model-written code in the tool sandbox, as an environment actor does
(importable, so it pickles by reference)."""

from __future__ import annotations

import ctypes
import os

import forge.envs.sandbox as sandbox
from controller import Actor, endpoint
from forge.envs import run_python


class SandboxHost(Actor):
    @endpoint
    def run(self, code: str, timeout_s: float = 5.0, namespaces: bool = True) -> dict:
        """``run_python(code)``, ``WORKER_PID`` replaced by this process's pid; ``namespaces``:
        ``False`` tries the subreaper alone."""
        sandbox.USE_NAMESPACES = namespaces
        r = run_python(code.replace("WORKER_PID", str(os.getpid())), timeout_s=timeout_s)
        return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}

    @endpoint
    def exposure(self) -> dict:
        """What a same-user process could learn about this one."""
        libc = ctypes.CDLL(None)
        with open("/proc/self/environ", "rb") as f:
            environ = f.read()
        return {
            "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
            "environ": environ.decode(errors="replace"),
            "env_names": sorted(os.environ),
        }
