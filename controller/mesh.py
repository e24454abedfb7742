"""Process meshes (the local backend): ``ProcMesh``, ``HostMesh``, ``this_host``.

``this_host().spawn_procs(per_host={"procs": N})`` starts N actor processes;
``proc_mesh.spawn(name, ActorCls, *args)`` constructs the actor on every one of them and
returns an ``ActorMesh``, a picklable handle whose attributes are the actor's endpoints.

``ActorMesh`` itself and how its calls travel live in ``controller/_actor_mesh.py``;
``MeshFailure`` and its delivery to ``__supervise__`` in ``controller/_supervision.py``. Both
names stay importable from here (and from ``controller``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

from controller import _context, _wire
from controller._actor_mesh import ActorMesh, ProcInfo, encode_per_rank, shm_reaches
from controller._launch import mesh_sizes, worker_env_vars
from controller._local import LocalProc, free_port, kill_all
from controller._runtime import get_runtime, install_signal_handlers
from controller._supervision import MeshFailure, supervise
from controller.errors import describe_exit
from controller.future import Future
from controller.shape import Shape

__all__ = ["ActorMesh", "HostMesh", "MeshFailure", "ProcMesh", "spawn_local", "this_host"]

# The actor class spawned (unbound: controller.actor imports this module, and a bound would
# need that import back, a cycle even under TYPE_CHECKING).
A = TypeVar("A")

logger = logging.getLogger("controller")


class ProcMesh:
    """A set of actor processes with named dimensions (``procs``, ``hosts``, ``gpus``)."""

    def __init__(self, name: str, shape: Shape, procs: list[Any]):
        self.name = name
        self._shape = shape
        self._procs = procs  # LocalProc, or a backend's proc that behaves alike
        self._infos = [ProcInfo(p.address, p.pid) for p in procs]
        self._stopped = False
        self._owner = _context.current_actor.get()
        try:
            self._owner_loop = asyncio.get_running_loop()
        except RuntimeError:
            self._owner_loop = None
        self._death_callbacks: list[Callable[[MeshFailure], None]] = []
        self._stop_callbacks: list[Callable[[], None]] = []
        self.gpus: list[str] = []  # devices given by the GPU provisioner (with_gpus=True)

    def __repr__(self) -> str:
        return f"<ProcMesh {self.name} {self._shape} pids={[p.pid for p in self._procs]}>"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def size(self, dim: str = "procs") -> int:
        return self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes_dict()

    def __len__(self) -> int:
        return len(self._shape)

    def add_death_callback(self, cb: Callable[[MeshFailure], None]) -> None:
        """Call ``cb(failure)`` (from a watcher thread) when a process dies unexpectedly."""
        self._death_callbacks.append(cb)

    def _on_proc_exit(self, proc: Any) -> None:
        get_runtime().fail_calls(proc.address)  # a lost host's sockets may never close
        if proc.stopping or self._stopped:
            return
        failure = MeshFailure(
            self.name,
            proc.rank,
            proc.pid,
            proc.returncode,
            f"process for mesh {self.name!r} rank {proc.rank} (pid {proc.pid}) died: "
            f"{describe_exit(proc.returncode)}",
        )
        for cb in self._death_callbacks:
            try:
                cb(failure)
            except Exception:
                logger.exception("death callback failed")
        supervise(self._owner, self._owner_loop, failure)

    def spawn(self, name: str, actor_cls: type[A], *args: Any, **kwargs: Any) -> A:
        """Construct ``actor_cls(*args, **kwargs)`` on every process. Returns the mesh at
        once; calls wait for construction (``await`` the mesh to wait explicitly). The
        ``ActorMesh`` is typed as the actor, as ``Actor.as_actor``'s handle is, so
        ``mesh.ep.call(...)`` is checked against the endpoint's signature."""
        if self._stopped:
            raise RuntimeError(f"{self!r} is stopped; spawn a new proc mesh")
        cls = getattr(actor_cls, "_forge_base", actor_cls)
        rt = get_runtime()
        actor_name = rt.unique_name(name)
        mesh = ActorMesh(actor_name, name, cls, self._infos, self._shape, self.name)
        mesh._proc_mesh = self
        ready: concurrent.futures.Future = concurrent.futures.Future()
        mesh._ready = ready
        encoded = encode_per_rank(
            (actor_name, cls, args, kwargs), len(self._infos), name, shm_reaches(self._infos)
        )

        async def construct():
            try:
                await asyncio.gather(
                    *(
                        mesh._request(r, _wire.SPAWN, body, "__init__", None)
                        for r, body in zip(range(len(self._infos)), encoded)
                    )
                )
            except BaseException as e:
                ready.set_exception(e)
            else:
                ready.set_result(None)

        Future(construct, f"spawn {name}").start()
        return cast("A", mesh)

    def stop(self) -> Future[None]:
        """Stop every process of the mesh (graceful exit, then SIGKILL after 2 s)."""

        async def run():
            if self._stopped:
                return
            self._stopped = True
            for p in self._procs:
                p.stopping = True
            await asyncio.gather(*(self._ask_exit(r) for r in range(len(self._procs))))
            await self._end_processes()
            rt = get_runtime()
            for p in self._procs:
                rt.local_procs.pop(p.address, None)
            if self in rt.proc_meshes:
                rt.proc_meshes.remove(self)
            for cb in self._stop_callbacks:
                cb()

        return Future(run, f"stop {self.name}")

    async def _end_processes(self) -> None:
        """After the graceful exit request: end whatever still runs (a backend's own way)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, kill_all, [p for p in self._procs if p.returncode is None])

    def on_stop(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` once the mesh's processes are gone (e.g. to release its GPUs)."""
        self._stop_callbacks.append(cb)

    async def _ask_exit(self, rank: int) -> None:
        p = self._procs[rank]
        if p.returncode is not None:
            return
        try:
            client = get_runtime().client(p.address, self.name, rank, p.pid)
            proto = await asyncio.wait_for(client.channel(), 1.0)
            proto.send(_wire.EXIT, 0)
            await asyncio.get_running_loop().run_in_executor(None, p.wait, 2.0)
        except Exception:  # noqa: BLE001 - we fall back to signals
            pass


class HostMesh:
    """The hosts to spawn processes on. ``this_host()`` is the local one."""

    def __init__(self, hosts: int = 1):
        self.hosts = hosts

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        env_vars: dict[str, str] | None = None,
        name: str | None = None,
        rank_env_vars: Callable[[int], dict[str, str]] | None = None,
    ) -> Future[ProcMesh]:
        """Start ``per_host`` processes (e.g. ``{"procs": 4}``) with extra environment
        variables ``env_vars`` (and ``rank_env_vars(r)`` for rank r only, e.g. its GPU)."""
        per_host = dict(per_host or {"procs": 1})
        for k, v in per_host.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"per_host[{k!r}] must be a positive int, got {v!r}")
        sizes = mesh_sizes(self.hosts, per_host)
        if self.hosts > 1:
            raise ValueError(
                f"the local backend runs on one host, but {self.hosts} hosts were asked for; "
                "use the monarch backend (FORGE_BACKEND=monarch) for multi-host meshes"
            )
        return Future(
            lambda: spawn_local(sizes, env_vars or {}, name or "procs", rank_env_vars),
            "spawn_procs",
        )


def this_host() -> HostMesh:
    """The host this controller runs on."""
    return HostMesh(1)


async def spawn_local(
    sizes: dict[str, int],
    env_vars: dict[str, str],
    name: str,
    rank_env_vars: Callable[[int], dict[str, str]] | None = None,
) -> ProcMesh:
    rt = get_runtime()
    install_signal_handlers()
    shape = Shape.full(sizes)
    mesh_name = rt.unique_name(name)
    n = len(shape)
    port = free_port()
    procs: list[LocalProc] = []
    holder: list[ProcMesh] = []

    def on_exit(p: LocalProc) -> None:
        if holder:
            holder[0]._on_proc_exit(p)

    rank_vars = worker_env_vars(
        rt.session.env_vars(), mesh_name, sizes, ("127.0.0.1", port), env_vars, rank_env_vars
    )

    def start() -> None:  # in a thread: a zygote's first start imports torch (seconds)
        for rank, penv in enumerate(rank_vars):
            address = f"unix:{os.path.join(rt.session.dir, f'{mesh_name}-{rank}.sock')}"
            penv["FORGE_ADDRESS"] = address
            procs.append(LocalProc(mesh_name, rank, n, address, penv, on_exit, zygote=True))

    loop = asyncio.get_running_loop()
    started = loop.run_in_executor(None, start)
    try:
        await asyncio.shield(started)
        for p in procs:
            rt.local_procs[p.address] = p
        await asyncio.gather(*(p.wait_ready() for p in procs))
    except BaseException:
        with contextlib.suppress(BaseException):  # a start under way ends first: its
            await started  # processes are then stopped with the others
        for p in procs:
            p.stopping = True
            rt.local_procs.pop(p.address, None)
        await loop.run_in_executor(None, kill_all, procs, 0.5)
        raise
    pm = ProcMesh(mesh_name, shape, procs)
    holder.append(pm)
    for p in procs:  # a process that died between ready and now
        if p.returncode is not None:
            pm._on_proc_exit(p)
    rt.proc_meshes.append(pm)
    return pm
