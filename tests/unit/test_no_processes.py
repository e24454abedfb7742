"""The unit tier's guard (tests/unit/conftest.py): starting a process fails loudly, naming
what was started and where such a test belongs."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess

import pytest

REFUSED = r"in a unit test: tests/unit/ starts no process.*tests/integration/, tests/checks/"


def test_subprocess_is_refused():
    with pytest.raises(RuntimeError, match=r"subprocess.Popen\(\['true'\]\) " + REFUSED):
        subprocess.run(["true"])
    with pytest.raises(RuntimeError, match=REFUSED):
        os.system("true")


def test_multiprocessing_and_fork_are_refused():
    for method in ("spawn", "fork", "forkserver"):
        process = multiprocessing.get_context(method).Process(target=print)
        with pytest.raises(RuntimeError, match=r"Process.start\(\) " + REFUSED):
            process.start()
    with pytest.raises(RuntimeError, match=r"os.fork\(\) " + REFUSED):
        os.fork()


async def test_asyncio_subprocess_is_refused():
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.create_subprocess_exec("true")
