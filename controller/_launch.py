"""What every backend shares when it starts a mesh's ranks: the launcher interface and the one
builder of a rank's environment.

A backend (``controller._backend`` for local processes, ``_ray``, ``_monarch``) is a module with
``async def launch(opts: ActorOptions, name: str) -> ProcMesh``: it decides where the ranks run
and starts one Forge worker (``python -m controller._worker``) per rank with the environment
``rank_envs`` builds. ``controller._backend`` picks the module ``FORGE_BACKEND`` names.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Protocol

from controller.shape import Shape


class Launch(Protocol):
    """``launch(opts, name)``: start the ranks ``opts`` (an ``ActorOptions``) asks for."""

    def __call__(self, opts, name: str) -> Awaitable: ...


def mesh_sizes(hosts: int, per_host: dict[str, int]) -> dict[str, int]:
    """The mesh's named dimensions: ``hosts`` first when there are several, then ``per_host``."""
    return ({"hosts": hosts} if hosts > 1 else {}) | dict(per_host)


def rank_envs(
    session_env: dict[str, str],
    mesh: str,
    sizes: dict[str, int],
    master: tuple[str, int],
    env: dict[str, str],
    rank_env: Callable[[int], dict[str, str]] | None = None,
) -> list[dict[str, str]]:
    """The environment of each rank of ``mesh`` (shape ``sizes``): the session, Forge's place
    (``FORGE_MESH``/``RANK``/``SIZE``/``SHAPE``), torch.distributed's (``MASTER_ADDR``/``PORT``
    from ``master``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), then the
    user's ``env`` and ``rank_env(rank)`` (e.g. a rank's GPU) on top."""
    n = len(Shape.full(sizes))
    per_host = n // sizes.get("hosts", 1)
    return [
        {
            **session_env,
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
            **env,
            **(rank_env(rank) if rank_env else {}),
        }
        for rank in range(n)
    ]
