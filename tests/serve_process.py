"""A ``forge serve`` process for tests: started on a free port, stopped with SIGINT, and
checked to leave no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO, script_env, wait_dead

TOY = "models: [{name: forge/tiny, path: tiny}]\n"
"""The ``models:`` line of a serve config naming the toy model (``--preset toy``); with no
models a server serves the real one, smollm2-135m-instruct."""


class Served(str):
    """The server's URL, with ``pid``: its process."""

    pid: int


@contextlib.contextmanager
def serve_process(work: Path, config: str, key: str):
    """Yield the URL (a ``Served``) of a server run with ``config`` (YAML text) and ``key``."""
    (work / "serve.yaml").write_text(config)
    proc = subprocess.Popen(  # the key in the environment, not on the command line
        [
            sys.executable,
            "-m",
            "forge.cli",
            "serve",
            "--config",
            str(work / "serve.yaml"),
            "--port",
            "0",
        ],
        cwd=str(REPO),
        env=script_env(FORGE_API_KEY=key),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines, url = [], None
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if m := re.search(r"Tinker API on (http://\S+)", line):
            url = m.group(1)
    if url is None:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("forge serve did not start:\n" + "".join(lines))
    with open(work / "server.log", "w") as log:
        drain = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=log)
        try:
            served = Served(url)
            served.pid = proc.pid
            yield served
        finally:
            try:
                children = stop_server(proc)
            finally:
                drain.wait(10)
    assert not wait_dead(children, 30), "processes outlived forge serve"


def stop_server(proc: subprocess.Popen) -> list[int]:
    """Stop ``forge serve`` as Ctrl-C does (SIGKILL to its group if it takes over 60 s);
    returns the pids of its children at the time, for the caller to check they are gone."""
    import psutil

    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return children
