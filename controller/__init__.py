"""Forge's actor runtime: actors, endpoints, process meshes and supervision.

Everything a program needs is importable from here::

    from controller import Actor, endpoint, this_host, shutdown

    class Counter(Actor):
        def __init__(self, start: int):
            self.n = start

        @endpoint
        async def incr(self, by: int = 1) -> int:
            self.n += by
            return self.n

    counter = await Counter.options(procs=2).as_actor(10)
    values = await counter.incr.call(5)          # ValueMesh: one value per rank
    one = await counter.slice(procs=0).incr.call_one()
    await shutdown()

Handles are typed as their actor class: a type checker reads ``counter.incr`` as a
``BoundEndpoint[(by: int = 1), int]``, checks each adverb's arguments against ``incr``'s and
types ``call_one``'s result as ``int`` (``controller/endpoint.py``).

This package never imports ``forge`` or ``torch`` at module level.
"""

from controller._backend import use_host_mesh
from controller._context import Point, current_rank, current_size
from controller._runtime import pid_alive, session_tag
from controller.actor import Actor, ActorOptions, shutdown
from controller.endpoint import Endpoint, Future, endpoint
from controller.errors import (
    ActorDiedError,
    ActorError,
    CallTimeoutError,
    ForgeRuntimeError,
    ServiceUnavailable,
    SpawnError,
)
from controller.loops import run
from controller.mesh import ActorMesh, HostMesh, MeshFailure, ProcMesh, this_host
from controller.router import LeastLoadedRouter, RoundRobinRouter, Router
from controller.service import Service, ServiceConfig, ServiceEndpoint
from controller.shape import Shape, ValueMesh

__all__ = [
    "Actor",
    "ActorDiedError",
    "ActorError",
    "ActorMesh",
    "ActorOptions",
    "CallTimeoutError",
    "Endpoint",
    "ForgeRuntimeError",
    "Future",
    "HostMesh",
    "LeastLoadedRouter",
    "MeshFailure",
    "Point",
    "ProcMesh",
    "RoundRobinRouter",
    "Router",
    "Service",
    "ServiceConfig",
    "ServiceEndpoint",
    "ServiceUnavailable",
    "Shape",
    "SpawnError",
    "ValueMesh",
    "current_rank",
    "current_size",
    "endpoint",
    "pid_alive",
    "run",
    "session_tag",
    "shutdown",
    "this_host",
    "use_host_mesh",
]
