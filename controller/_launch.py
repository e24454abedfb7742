"""What every backend shares when it starts a mesh's ranks: the launcher interface and the one
builder of a rank's environment.

A backend (``controller._backend`` for local processes, ``_ray``, ``_monarch``) is a module with
``async def launch(opts: ActorOptions, name: str) -> ProcMesh``: it decides where the ranks run
and starts one Forge worker (``python -m controller._worker``) per rank with the environment
``worker_env_vars`` builds. ``controller._backend`` picks the module ``FORGE_BACKEND`` names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from controller.errors import describe_exit
from controller.shape import Shape


class Launch(Protocol):
    """``launch(opts, name)``: start the ranks ``opts`` (an ``ActorOptions``) asks for."""

    def __call__(self, opts, name: str) -> Awaitable: ...


def mesh_sizes(hosts: int, per_host: dict[str, int]) -> dict[str, int]:
    """The mesh's named dimensions: ``hosts`` first when there are several, then ``per_host``."""
    return ({"hosts": hosts} if hosts > 1 else {}) | dict(per_host)


def worker_env_vars(
    session_vars: dict[str, str],
    mesh: str,
    sizes: dict[str, int],
    master: tuple[str, int],
    env_vars: dict[str, str],
    rank_env_vars: Callable[[int], dict[str, str]] | None = None,
) -> list[dict[str, str]]:
    """The environment variables of each rank of ``mesh`` (shape ``sizes``): the session,
    Forge's place (``FORGE_MESH``/``RANK``/``SIZE``/``SHAPE``), torch.distributed's
    (``MASTER_ADDR``/``PORT`` from ``master``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``), then the user's ``env_vars`` and ``rank_env_vars(rank)`` (e.g. a
    rank's GPU) on top."""
    n = len(Shape.full(sizes))
    per_host = n // sizes.get("hosts", 1)
    return [
        {
            **session_vars,
            "FORGE_MESH": mesh,
            "FORGE_RANK": str(rank),
            "FORGE_SIZE": str(n),
            "FORGE_SHAPE": json.dumps(sizes),
            "MASTER_ADDR": master[0],
            "MASTER_PORT": str(master[1]),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % per_host),
            "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(per_host),
            **env_vars,
            **(rank_env_vars(rank) if rank_env_vars else {}),
        }
        for rank in range(n)
    ]


class WatchedProc:
    """Controller-side handle of a worker that another process started and watches for us (a
    Ray or Monarch actor on the worker's host). Offers what ``ProcMesh`` and the runtime use of
    a ``LocalProc``: address, pid, rank, stopping, returncode, ``wait``, ``signal``,
    ``describe``. Subclasses set their handle first, then call ``__init__``, and implement
    ``_wait_exit()`` (blocks; the returncode, or raises when the watcher itself is gone) and
    ``_send_signal(sig)``."""

    gone = "its watcher is gone"  # why an exit status may be unknown, for messages

    def __init__(self, mesh, rank, size, address, pid, host, on_exit):
        self.mesh, self.rank, self.size, self.address = mesh, rank, size, address
        self.pid, self.host = pid, host
        self.stopping = False
        self.returncode: int | None = None
        self.lost = ""  # why the exit status is unknown (the watching process died)
        self._on_exit = on_exit
        self._exited = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name=f"watch-{mesh}-{rank}").start()

    def _wait_exit(self) -> int | None:
        raise NotImplementedError

    def _send_signal(self, sig: int) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        try:
            self.returncode = self._wait_exit()
        except Exception as e:  # noqa: BLE001 - the watcher is gone; keep why
            text = str(e).strip()
            self.lost = f"{self.gone} ({text.splitlines()[0] if text else type(e).__name__})"
        self._exited.set()
        self._on_exit(self)

    def wait(self, timeout: float | None = None) -> int | None:
        self._exited.wait(timeout)
        return self.returncode

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def signal(self, sig: int) -> None:
        if not self._exited.is_set():
            self._send_signal(sig)  # the exit is reported by _watch

    def describe(self) -> str:
        state = "alive" if not self.exited else (self.lost or describe_exit(self.returncode))
        return f"mesh {self.mesh!r} rank {self.rank} pid {self.pid} on {self.host} ({state})"
