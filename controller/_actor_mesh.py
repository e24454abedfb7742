"""Actor meshes: ``ActorMesh``, the picklable handle to one actor on every process of a mesh,
and how its calls are encoded, sent and answered.

``ProcMesh.spawn`` (``controller/mesh.py``) builds one; programs import ``ActorMesh`` from
``controller`` (or ``controller.mesh``), not from here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from controller import _context, _wire
from controller import _serialization as ser
from controller._runtime import get_runtime
from controller._supervision import MeshFailure, supervise
from controller.endpoint import Endpoint, EndpointProperty
from controller.errors import ActorError, CallTimeoutError
from controller.future import Future
from controller.shape import Shape, ValueMesh


class OwnedProcs(Protocol):
    """What an ``ActorMesh`` needs of the ``ProcMesh`` it was spawned on (``controller/mesh.py``,
    which imports this module, so the type is structural)."""

    def stop(self) -> Future[None]: ...


@dataclass(frozen=True)
class ProcInfo:
    """How to reach one process of a mesh (picklable)."""

    address: str
    pid: int


def shm_reaches(infos: list[ProcInfo]) -> bool:
    """Shared-memory payloads only reach processes on this host, i.e. behind a unix socket.
    Monarch-backend workers listen on TCP and may be remote: their tensors travel in-band."""
    return all(i.address.startswith("unix:") for i in infos)


def encode_per_rank(obj, n: int, what: str, use_shm: bool = True) -> list[bytes]:
    """Pickle once; re-pickle per rank only when shared-memory payloads are involved (each
    receiver claims, and removes, its own copy)."""
    try:
        body, shm = ser.dumps(obj, use_shm=use_shm)
    except Exception as e:
        detail = None
        if isinstance(obj, tuple) and len(obj) == 4:
            detail = ser.find_unpicklable(obj[2], obj[3])
        raise TypeError(
            f"cannot send the arguments of {what}: {detail or e}. Arguments travel to another "
            "process: pass picklable data, tensors or actor handles (not locks, open files or "
            "sockets)."
        ) from e
    if not shm or n == 1:
        return [body] * n
    return [body] + [ser.dumps(obj, use_shm=use_shm)[0] for _ in range(n - 1)]


class ActorMesh:
    """A handle to one actor on every process of a mesh. Picklable: pass it to other actors.

    Endpoints are attributes: ``await mesh.my_endpoint.call_one(...)``. ``mesh.slice(procs=1)``
    narrows the ranks addressed.
    """

    def __init__(self, actor_name, display, cls, infos, shape, mesh_name):
        self._actor_name = actor_name
        self._display: str = display
        self._cls = cls
        self._infos: list[ProcInfo] = infos
        self._shape: Shape = shape
        self._mesh_name = mesh_name
        self._ready: concurrent.futures.Future | None = None
        self._proc_mesh: OwnedProcs | None = None
        self._owns_proc_mesh = False
        self._rr = itertools.count()
        self._use_shm = shm_reaches(infos)  # False for Monarch-backend (TCP) workers

    # -- identity --------------------------------------------------------------------------
    def __reduce__(self):
        return (
            _rebuild_actor_mesh,
            (self._actor_name, self._display, self._cls, self._infos, self._shape, self._mesh_name),
        )

    def __repr__(self) -> str:
        return f"<ActorMesh {self._display} ({self._cls.__name__}) {self._shape}>"

    def __len__(self) -> int:
        return len(self._shape)

    def size(self, dim: str = "procs") -> int:
        return self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes_dict()

    @property
    def pids(self) -> list[int]:
        return [self._infos[r].pid for r in self._shape.ranks]

    def slice(self, **dims: int | slice) -> ActorMesh:
        """The same actor on a subset of ranks, e.g. ``mesh.slice(procs=0)``."""
        sub = object.__new__(type(self))
        shape = self._shape.slice(**dims)
        ActorMesh.__init__(
            sub, self._actor_name, self._display, self._cls, self._infos, shape, self._mesh_name
        )
        self._init_slice(sub)
        return sub

    def _init_slice(self, sub: ActorMesh) -> None:
        """What a slice shares with the mesh it was cut from (subclasses add theirs)."""
        sub._ready = self._ready
        sub._default_timeout = self._default_timeout

    _default_timeout: float | None = None  # the bound of a call that names no timeout

    def with_default_timeout(self, seconds: float | None) -> ActorMesh:
        """The same actor, each call of which that passes no ``timeout=`` is bounded by
        ``seconds`` (``CallTimeoutError`` naming the endpoint and rank); ``None``: unbounded."""
        sub = self.slice()
        sub._default_timeout = seconds
        return sub

    def __getattr__(self, name: str) -> Endpoint[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.endpoint(name)

    def endpoint(self, name: str) -> Endpoint[..., Any]:
        """The endpoint called ``name`` (also reachable as ``mesh.<name>``)."""
        attr = getattr(self._cls, name, None)
        if isinstance(attr, EndpointProperty):
            return Endpoint(self, attr, self._default_timeout)
        eps = sorted(
            k for k in dir(self._cls) if isinstance(getattr(self._cls, k, None), EndpointProperty)
        )
        if attr is None:
            raise AttributeError(
                f"{self._cls.__name__} has no endpoint {name!r}; its endpoints are {eps}"
            )
        raise AttributeError(
            f"{self._cls.__name__}.{name} is not an endpoint; decorate it with @endpoint to "
            "call it remotely"
        )

    def __await__(self):
        yield from self._await_ready().__await__()
        return self

    async def _await_ready(self) -> None:
        r = self._ready
        if r is None or (r.done() and r.exception() is None):
            return
        await asyncio.wrap_future(r)

    # -- sending ---------------------------------------------------------------------------
    async def _request(self, rank: int, kind: int, body: bytes, ep: str, timeout):
        info = self._infos[rank]
        client = get_runtime().client(info.address, self._mesh_name, rank, info.pid)
        proto = client.proto
        if proto is None or proto.closed:
            await client.channel()
        fut = client.request(kind, body)
        if timeout is None:
            kind, payload = await fut
        else:
            try:
                kind, payload = await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                client.pending.pop(fut.cid, None)
                if client.proto is not None and not client.proto.closed:
                    client.proto.send(_wire.CANCEL, fut.cid)
                raise CallTimeoutError(
                    f"{self._display}.{ep} on rank {rank} (pid {info.pid}) did not answer "
                    f"within {timeout} s"
                ) from None
        if kind == _wire.OK:
            return ser.loads(payload)
        rtype, msg, tb, pickled = ser.loads(payload)
        exc = None
        if pickled is not None:
            try:
                exc = ser.loads(pickled)
            except Exception:  # noqa: BLE001 - the type may not exist here; keep the text
                exc = None
        raise ActorError(self._display, ep, rank, rtype, msg, tb, exc)

    def _encode(self, ep: str, args, kwargs, n: int) -> list[bytes]:
        return encode_per_rank(
            (self._actor_name, ep, args, kwargs), n, f"{self._display}.{ep}", self._use_shm
        )

    def _call_all(self, ep: str, args, kwargs, timeout) -> Future[ValueMesh]:
        ranks = self._shape.ranks
        bodies = self._encode(ep, args, kwargs, len(ranks))

        async def run():
            await self._await_ready()
            if len(ranks) == 1:  # no gather: a Task per rank costs loop iterations
                value = await self._request(ranks[0], _wire.CALL, bodies[0], ep, timeout)
                return ValueMesh(self._shape, [value])
            values = await asyncio.gather(
                *(self._request(r, _wire.CALL, b, ep, timeout) for r, b in zip(ranks, bodies))
            )
            return ValueMesh(self._shape, list(values))

        return Future(run, f"{self._display}.{ep}.call")

    async def _first_value(self, ep: str, args, kwargs) -> Any:
        """Rank 0's value of ``self.endpoint(ep).call(...)``: how a service calls a replica.
        A one-rank mesh is called straight, without the ``Endpoint``, ``Future`` and
        ``ValueMesh`` the general path builds (a service's ``route`` is a hot path);
        ``timeout=`` takes the long way."""
        if len(self._shape) != 1 or "timeout" in kwargs:
            return (await self.endpoint(ep).call(*args, **kwargs)).values()[0]
        body = self._encode(ep, args, kwargs, 1)[0]
        ready = self._ready
        if ready is not None and not (ready.done() and ready.exception() is None):
            await self._await_ready()
        return await self._request(self._shape.ranks[0], _wire.CALL, body, ep, None)

    def _pick_rank(self) -> int:
        ranks = self._shape.ranks
        if len(ranks) == 1:
            return ranks[0]
        rt = get_runtime()
        start = next(self._rr)
        best, best_load = ranks[start % len(ranks)], None
        for i in range(len(ranks)):
            r = ranks[(start + i) % len(ranks)]
            info = self._infos[r]
            load = rt.client(info.address, self._mesh_name, r, info.pid).in_flight
            if best_load is None or load < best_load:
                best, best_load = r, load
        return best

    def _call_rank(self, ep: str, index: int | None, args, kwargs, timeout) -> Future:
        body = self._encode(ep, args, kwargs, 1)[0]
        ranks = self._shape.ranks

        async def run():
            await self._await_ready()
            r = ranks[index] if index is not None else self._pick_rank()
            return await self._request(r, _wire.CALL, body, ep, timeout)

        return Future(run, f"{self._display}.{ep}")

    def _broadcast(self, ep: str, args, kwargs, timeout) -> None:
        fut = self._call_all(ep, args, kwargs, timeout)
        owner = _context.current_actor.get()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None

        async def run():
            try:
                await fut
            except Exception as e:  # noqa: BLE001 - reported, not raised: nobody awaits
                supervise(
                    owner,
                    loop,
                    MeshFailure(
                        self._mesh_name,
                        getattr(e, "rank", None),
                        None,
                        None,
                        f"broadcast {self._display}.{ep} failed: {e}",
                        e,
                    ),
                )

        Future(run, f"{self._display}.{ep}.broadcast").start()

    def _stream(self, ep: str, args, kwargs, timeout) -> AsyncIterator:
        ranks = self._shape.ranks
        bodies = self._encode(ep, args, kwargs, len(ranks))

        async def gen():
            await self._await_ready()
            tasks = [
                asyncio.ensure_future(self._request(r, _wire.CALL, b, ep, timeout))
                for r, b in zip(ranks, bodies)
            ]
            try:
                for nxt in asyncio.as_completed(tasks):
                    yield await nxt
            finally:
                for t in tasks:
                    t.cancel()

        return gen()

    # -- lifetime --------------------------------------------------------------------------
    def shutdown(self) -> Future[None]:
        """Stop this actor; if it was made by ``as_actor``, stop its processes too."""

        async def run():
            if self._owns_proc_mesh and self._proc_mesh is not None:
                await self._proc_mesh.stop()
                return
            body = ser.dumps(self._actor_name)[0]
            await asyncio.gather(
                *(
                    self._request(r, _wire.STOP_ACTOR, body, "shutdown", 5.0)
                    for r in self._shape.ranks
                ),
                return_exceptions=True,
            )

        return Future(run, f"shutdown {self._display}")


def _rebuild_actor_mesh(actor_name, display, cls, infos, shape, mesh_name) -> ActorMesh:
    return ActorMesh(actor_name, display, cls, infos, shape, mesh_name)
