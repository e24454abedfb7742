"""The controller on the oldest Python that pyproject.toml allows (3.10), where asyncio lacks
``create_task(context=)`` and eager tasks: an actor with async endpoints, one that finishes
without suspending and one that suspends, called from a 3.10 interpreter.

Needs a ``python3.10`` (pyenv's, or one on PATH); skips with the reason otherwise. The
controller needs no torch, so a venv with only cloudpickle and psutil is enough (built once
under ``~/.cache/forge/py310-venv``, ~15 s)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = """
import asyncio, sys
from controller import Actor, endpoint, loops, shutdown

class A(Actor):
    @endpoint
    async def fast(self, x):
        return x + 1

    @endpoint
    async def slow(self, x):
        await asyncio.sleep(0.05)
        return x * 2

async def main():
    a = await A.as_actor()
    print(sys.version_info[:2], await a.fast.call_one(1), await a.slow.call_one(21))
    await shutdown()

loops.run(main())
"""


def _python310() -> str | None:
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10.*/bin/python3.10")))
    return pyenv[-1] if pyenv else shutil.which("python3.10")


def test_async_endpoints_run_on_python_3_10():
    base = _python310()
    if base is None:
        pytest.skip("no python3.10 on this machine (pyenv or PATH)")
    venv = Path.home() / ".cache" / "forge" / "py310-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "cloudpickle>=3.0", "psutil"],
            check=True,
            timeout=300,
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [str(py), "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["(3,", "10)", "2", "42"], out.stdout
