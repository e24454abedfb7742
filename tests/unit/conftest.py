"""``tests/unit`` starts no process: while a unit test runs (its fixtures' setup and teardown
included), every way of starting one raises ``ProcessStartRefused`` instead.

Refused: ``subprocess.Popen`` (so ``subprocess.run``, ``os.popen`` and asyncio subprocesses
too), ``multiprocessing`` / ``torch.multiprocessing`` ``Process.start`` (every start method),
``os.fork``/``os.forkpty`` (so ``pty.fork`` and ``os.spawn*``), ``os.posix_spawn[p]`` and
``os.system``. A test that needs a real process belongs in ``tests/integration/`` (real
processes, seconds each), ``tests/checks/`` (a tool or a fresh interpreter over the
repository) or ``tests/e2e/`` (whole programs, anything slow): see ``tests/conftest.py``.

The guard is a set of hook wrappers rather than an autouse fixture so that it also covers
fixtures of module and session scope, which pytest sets up before any function fixture.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess

import pytest

WHERE = (
    "tests/unit/ starts no process: use an in-process fake (controller.testing) or move "
    "the test to tests/integration/, tests/checks/ or tests/e2e/ (see tests/conftest.py)"
)


class ProcessStartRefused(RuntimeError):
    """A unit test (or one of its fixtures) tried to start a process."""


def _refuse(what: str):
    def start(*args, **kwargs):
        raise ProcessStartRefused(f"{what} in a unit test: {WHERE}")

    return start


def _refuse_popen(self, *args, **kwargs):
    self._child_created = False  # what Popen.__del__ reads: nothing to reap
    command = args[0] if args else kwargs.get("args")
    raise ProcessStartRefused(f"subprocess.Popen({command!r}) in a unit test: {WHERE}")


@contextlib.contextmanager
def refusing_processes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", _refuse_popen)
        mp.setattr(multiprocessing.process.BaseProcess, "start", _refuse("Process.start()"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}()"))
        yield


@pytest.fixture(autouse=True)
def _stop_everything():
    """Overrides tests/conftest.py's: a unit test spawned nothing, so there is nothing to stop
    (and no event loop to make for it)."""
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with refusing_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with refusing_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with refusing_processes():
        return (yield)
