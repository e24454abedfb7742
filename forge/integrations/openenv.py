"""OpenEnv (``openenv-core``) environment servers as Forge environments.

``OpenEnvClient`` drives one episode on an OpenEnv server: ``reset`` opens a session, each
model turn is one ``step`` with the turn's text as the action, ``close`` ends the session.
Built-in slot name ``openenv`` (``pip install openenv-core``)::

    env:
      fn: {fn: openenv, kwargs: {server: "mypkg.server:app", action_field: message}}

The wire protocol is OpenEnv's own, through its ``GenericEnvClient``: a WebSocket at
``<base_url>/ws`` carrying ``{"type": "reset", "data": {...}}`` / ``{"type": "step",
"data": <action fields>}`` and answered with ``{"type": "observation", "data":
{"observation": {...}, "reward": r, "done": d}}``. (OpenEnv's plain HTTP ``/reset`` and
``/step`` build a fresh environment per request, so they cannot hold an episode; the
WebSocket session is the stateful path.) Each session has its own environment instance on
the server, so the server's ``max_concurrent_envs`` must cover the episodes in flight
(``group_size`` x groups); past it the server refuses the session (``CAPACITY_REACHED``).

Mapping: the action is ``{action_field: text}`` (or ``action_fn(text) -> dict``); the
observation shown to the model is its ``observation_field`` (default: the one field, or
``name: value`` lines); the reward is the server's (``None`` counts 0), ``done`` is the
server's, and ``info["observation"]`` keeps the whole observation. ``reset`` sends the
task's fields (minus ``prompt``/``target``/``task_id``/``id``) and ``reset_kwargs``; the
server passes those its environment's ``reset`` accepts (``seed``, ...).

Servers: ``base_url`` for a server someone runs, or ``server="pkg.module:app"`` (an ASGI
app, e.g. from ``openenv.core.env_server.create_app``) to have Forge run it: one uvicorn
process per app per Forge process (the rollout loop's, or each env replica's), started on a
free local port by the first episode, shared by the later ones, and stopped at exit
(``atexit``; ``stop_servers()`` stops them sooner; on Linux it also dies with its parent).
Every wait is bounded by ``timeout_s`` and errors name the URL and what failed.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from forge.envs import Environment, StepResult

__all__ = ["OpenEnvClient", "stop_servers"]

_TASK_ONLY = ("prompt", "target", "task_id", "id")


def _generic_client():
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise ImportError(
            "the openenv environment needs openenv-core: pip install openenv-core "
            "(or pip install 'forge[envs]')"
        ) from e
    return GenericEnvClient


class OpenEnvClient(Environment):
    """One episode on an OpenEnv server (see the module docstring).

    Args:
        base_url: ``http://host:port`` of a running server (``ws://`` works too).
        server: instead, ``"pkg.module:app"``: an ASGI app Forge serves itself.
        action_field: the action's field that gets the model's text.
        action_fn: instead, ``fn(text) -> dict`` (or its import string) building the action.
        observation_field: the observation's field shown to the model (default: all).
        reset_kwargs: sent with every reset, under the task's own fields.
        timeout_s: bound on connecting and on each answer (and on a server's start).
    """

    @classmethod
    def check_config(cls, **kwargs: Any) -> None:
        """At config load: the arguments must make an environment (building one is cheap:
        nothing is played or connected before ``reset``)."""
        cls(**kwargs)

    def __init__(
        self,
        base_url: str = "",
        server: str = "",
        action_field: str = "message",
        action_fn: str | Callable[[str], dict] | None = None,
        observation_field: str = "",
        reset_kwargs: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if bool(base_url) == bool(server):
            raise ValueError(
                "OpenEnvClient needs exactly one of base_url (a running server) and server "
                f"('pkg.module:app' to start); got base_url={base_url!r}, server={server!r}"
            )
        if server and ":" not in server:
            raise ValueError(f"server {server!r} is not an ASGI app import string 'pkg.module:app'")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if isinstance(action_fn, str):
            from forge.plugins import import_string

            action_fn = import_string(action_fn)
        self.base_url, self.server = base_url.rstrip("/"), server
        self.action_field, self.action_fn = action_field, action_fn
        self.observation_field = observation_field
        self.reset_kwargs = dict(reset_kwargs or {})
        self.timeout_s = timeout_s
        self.client: Any = None

    async def reset(self, task: Any) -> str:
        generic = _generic_client()
        if self.server:
            self.base_url = await _shared_server(self.server, self.timeout_s)
        await self.close()
        self.client = generic(
            self.base_url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
        )
        await self._call("connect", self.client.connect())
        fields = (
            {k: v for k, v in task.items() if k not in _TASK_ONLY} if isinstance(task, dict) else {}
        )
        result = await self._call("reset", self.client.reset(**{**self.reset_kwargs, **fields}))
        return self._text(result.observation)

    async def step(self, action: str) -> StepResult:
        if self.client is None:
            raise RuntimeError("OpenEnvClient.step before reset")
        payload = self.action_fn(action) if self.action_fn else {self.action_field: action}
        result = await self._call("step", self.client.step(payload))
        return StepResult(
            self._text(result.observation),
            reward=float(result.reward or 0.0),
            done=bool(result.done),
            info={"observation": result.observation},
        )

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.disconnect()

    async def _call(self, what: str, coro) -> Any:
        """``await coro`` within ``timeout_s``; failures name the server and the call."""
        where = f"OpenEnv server {self.base_url}"
        try:
            return await asyncio.wait_for(coro, self.timeout_s + 1.0)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{where}: no answer to {what} within {self.timeout_s} s") from None
        except (ConnectionError, OSError) as e:
            raise ConnectionError(f"{where}: {what} failed: {e}; is the server running?") from e
        except RuntimeError as e:  # the server's error message ({"type": "error"})
            raise RuntimeError(f"{where}: {what} failed: {e}") from e
        except Exception as e:  # noqa: BLE001 - websockets' closed-connection errors etc.
            raise ConnectionError(f"{where}: {what} failed: {type(e).__name__}: {e}") from e

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, dict):
            return str(observation)
        if self.observation_field:
            if self.observation_field not in observation:
                raise KeyError(
                    f"OpenEnv observation has no field {self.observation_field!r}; it has "
                    f"{sorted(observation)}"
                )
            return str(observation[self.observation_field])
        if len(observation) == 1:
            return str(next(iter(observation.values())))
        return "\n".join(f"{k}: {v}" for k, v in observation.items())


# -- servers Forge runs itself ---------------------------------------------------------------


class _Server:
    """A uvicorn process serving ``app`` on a free local port."""

    def __init__(self, app: str) -> None:
        with socket.socket() as s:  # a free port (released just before uvicorn binds it)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app, self.url = app, f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            app,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(
                    f"OpenEnv server {self.app!r} exited with {self.proc.returncode} before "
                    f"serving {self.url}:\n{tail}"
                )
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"OpenEnv server {self.app!r} did not listen on {self.url} in {timeout_s} s"
                )
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _pythonpath() -> str:
    """This process's import path, so the server finds the modules the config names."""
    return os.pathsep.join(p for p in sys.path if p)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the process that started it dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_servers: dict[str, _Server] = {}  # app -> its server in this process
_lock = threading.Lock()


async def _shared_server(app: str, timeout_s: float) -> str:
    """The URL of this process's server for ``app``, started on first use."""
    with _lock:
        server = _servers.get(app)
        if server is None or server.proc.poll() is not None:
            if not _servers:
                atexit.register(stop_servers)
            server = _servers[app] = _Server(app)
    try:
        await server.wait_ready(timeout_s)
    except Exception:
        with _lock:
            if _servers.get(app) is server:
                del _servers[app]
        raise
    return server.url


def stop_servers() -> None:
    """Stop every OpenEnv server this process started (also run at exit)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()
