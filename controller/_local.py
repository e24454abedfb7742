"""The local backend: actor processes on this host, started and watched by this process.

Each process gets two pipes and a socket besides stdout/stderr: a *lifeline* it reads until
EOF (when its parent dies, however it dies, the kernel closes the pipe and the child exits at
once, taking its own process group with it), a *ready* pipe it writes one line to once it
listens on its socket, and the socket the session's secret comes over
(``FORGE_SESSION_KEY_FD``), so that the secret is never in the child's environment, where
``/proc/<pid>/environ`` would show it to every process of the user. The secret is sent only
after the child has said it is non-dumpable (``wait_ready``): until then, another process of
the user could open the child's ``/proc/<pid>/fd/*``, and a pipe opened that way is the same
pipe, its contents readable (and writable back, unnoticed). A socket cannot be opened that
way at all. With ``zygote`` (the local backend's meshes), a process whose variables name
modules to preload is forked by a zygote that has imported them (``controller._zygote``,
which also reads ``FORGE_ZYGOTE``); any other is started with ``subprocess.Popen``. A
waiter thread per process reports its death within milliseconds; two reader threads forward
its output prefixed with ``[mesh rank/size]``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from controller import _zygote, malloc
from controller.env_vars import NOT_DUMPABLE, SESSION_KEY, SESSION_KEY_FD
from controller.errors import SpawnError, describe_exit

logger = logging.getLogger("controller")

SPAWN_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(env_vars: dict[str, str]) -> dict[str, str]:
    """The environment of an actor process with ``env_vars`` (before its pipes' numbers):
    this process's, the mesh's variables, glibc malloc settings (``controller.malloc``), this
    ``sys.path``, unbuffered output, and this package importable."""
    env = malloc.tuned_env({**os.environ, **env_vars})  # keep freed memory: no page faults
    env["FORGE_SYS_PATH"] = json.dumps([p for p in sys.path if p])
    env["PYTHONUNBUFFERED"] = "1"
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


class LocalProc:
    """One actor process of a mesh, owned by this process."""

    def __init__(
        self,
        mesh: str,
        rank: int,
        size: int,
        address: str,
        env_vars: dict[str, str],
        on_exit: Callable[[LocalProc], None],
        zygote: bool = False,
    ):
        self.mesh, self.rank, self.size, self.address = mesh, rank, size, address
        self.stopping = False
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._on_exit = on_exit
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=30)
        life_r, self._life_w = os.pipe()
        self._ready_r, ready_w = os.pipe()
        os.set_inheritable(life_r, True)
        os.set_inheritable(ready_w, True)
        full_env = worker_env(env_vars)
        full_env["FORGE_LIFELINE_FD"] = str(life_r)
        full_env["FORGE_READY_FD"] = str(ready_w)
        fds = [life_r, ready_w]
        key = full_env.pop(SESSION_KEY, None)
        self._key: tuple[socket.socket, bytes] | None = None
        if key is not None:  # over a socket: never in the child's /proc/<pid>/environ
            mine, theirs = socket.socketpair()
            self._key = (mine, key.encode())
            fds.append(theirs.detach())
            full_env[SESSION_KEY_FD] = str(fds[-1])
        try:
            named = {"FORGE_LIFELINE_FD": life_r, "FORGE_READY_FD": ready_w}
            if key is not None:
                named[SESSION_KEY_FD] = fds[-1]
            forked = _zygote.spawn_worker(full_env, named) if zygote else None
            self.popen = forked or subprocess.Popen(
                [sys.executable, "-m", "controller._worker"],
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tuple(fds),
                start_new_session=True,  # Ctrl-C goes to the controller, which stops us cleanly
            )
        except BaseException:
            if self._key is not None:
                self._key[0].close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self.pid = self.popen.pid
        prefix = f"[{mesh} {rank}/{size}] "
        self._readers = [
            threading.Thread(
                target=_forward, args=(stream, out, prefix, tail), daemon=True, name=f"log-{mesh}"
            )
            for stream, out, tail in (
                (self.popen.stdout, sys.stdout, None),
                (self.popen.stderr, sys.stderr, self.stderr_tail),
            )
        ]
        for t in self._readers:
            t.start()
        threading.Thread(target=self._wait, daemon=True, name=f"wait-{mesh}-{rank}").start()

    def _wait(self) -> None:
        rc = self.popen.wait()
        self.returncode = rc
        try:
            os.close(self._life_w)
        except OSError:
            pass
        # Its last lines are forwarded before anyone hears it exited (a controller that exits
        # right after shutdown() would otherwise drop them); bounded, since a descendant may
        # still hold the pipes open.
        for t in self._readers:
            t.join(timeout=2.0)
        self._exited.set()
        self._on_exit(self)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the process exits (or ``timeout``); returns its returncode or None."""
        self._exited.wait(timeout)
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    async def wait_ready(self, timeout: float = SPAWN_TIMEOUT_S) -> None:
        """Hand the child the session's secret once it is non-dumpable, then wait for its
        ready line (``SpawnError`` if it exits first or takes over ``timeout``)."""
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(
                loop.run_in_executor(None, self._start_up, timeout), timeout
            )
        except asyncio.TimeoutError:
            raise SpawnError(
                f"process for mesh {self.mesh!r} rank {self.rank} (pid {self.pid}) did not "
                f"start within {timeout:.0f} s"
            ) from None
        finally:
            os.close(self._ready_r)
        if not line:
            rc = await loop.run_in_executor(None, self.wait, 5.0)
            await asyncio.sleep(0.05)  # let the stderr reader catch the last lines
            tail = "".join(self.stderr_tail).rstrip()
            raise SpawnError(
                f"process for mesh {self.mesh!r} rank {self.rank} (pid {self.pid}) exited "
                f"during start-up ({describe_exit(rc)})" + (f":\n{tail}" if tail else "")
            )
        parts = line.split()
        if len(parts) > 1:  # the worker chose its TCP port (Monarch backend): use its address
            self.address = parts[1].decode()

    def _start_up(self, timeout: float) -> bytes:
        """The secret, sent when the child says ``NOT_DUMPABLE`` (not if it exits first: then
        nothing), then the child's ready line (``b""`` if it exited)."""
        if self._key is not None:
            (sock, key), self._key = self._key, None
            with sock:
                sock.settimeout(timeout)
                try:
                    if sock.recv(len(NOT_DUMPABLE)) == NOT_DUMPABLE:
                        sock.sendall(key)
                except OSError:  # it exited, or took too long: its ready line says which
                    pass
        return _read_line(self._ready_r)

    def describe(self) -> str:
        state = "alive" if self.returncode is None else describe_exit(self.returncode)
        return f"mesh {self.mesh!r} rank {self.rank} pid {self.pid} ({state})"


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 256)
        if not chunk:
            return b""
        data += chunk
    return data


def _forward(stream, out, prefix: str, tail) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if tail is not None:
            tail.append(line)
        try:
            out.write(prefix + line)
            out.flush()
        except (ValueError, OSError):  # the controller's stream was closed at exit
            pass
    stream.close()


def kill_all(procs: list[LocalProc], grace_s: float = 2.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL the stragglers (blocking)."""
    for p in procs:
        p.stopping = True
        p.signal(signal.SIGTERM)
    for p in procs:
        if p.wait(grace_s) is None:
            p.signal(signal.SIGKILL)
            p.wait(2.0)
