"""The Monarch backend (``FORGE_BACKEND=monarch``): Forge workers placed by Monarch.

Monarch decides *where* processes run: this host, or the hosts of a Monarch job (SLURM,
Kubernetes) registered with ``use_host_mesh``. Forge's own protocol still carries every call:

    controller ──Monarch──> Monarch proc (one per rank) running a ``_Bootstrap`` actor
                                 └─ child: python -m controller._worker  (tcp:<host ip>:<port>)
    controller ──Forge TCP (HMAC-authenticated)──> worker

Each bootstrap actor starts an ordinary Forge worker as its child (with a lifeline: when the
Monarch process dies, however it dies, the worker follows) and reports the worker's address and
pid. The controller then builds a normal ``ProcMesh`` over those addresses, so actor meshes,
every adverb, services and supervision work unchanged.

Why a child process rather than user actors inside Monarch's own actors: Monarch 0.7.0 refuses
actor classes that mix sync and async endpoints, which Forge actors do freely. The bootstrap
actor's endpoints are all async; user actors never meet Monarch.

Death: the caller sees EOF on its TCP connection (``ActorDiedError``); the bootstrap actor
reports the worker's exit status (``wait_exit``), so the error names the exit code or signal.
Tensors: workers may be on another host, so tensors to and from them travel in-band (shared
memory is used only for unix-socket peers; see ``_actor_mesh.shm_reaches``). The session secret
travels as an endpoint argument to the bootstrap actor and into the worker's environment.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import socket
import sys

from controller import _runtime
from controller._launch import WatchedProc, mesh_sizes, worker_env_vars
from controller._local import LocalProc, free_port
from controller._runtime import ENV_DIR, get_runtime, install_signal_handlers
from controller.endpoint import Future
from controller.errors import SpawnError
from controller.mesh import ProcMesh
from controller.shape import Shape

try:
    from monarch.actor import Actor as _MonarchActor
    from monarch.actor import concurrent_endpoint
    from monarch.actor import current_rank as _monarch_rank
    from monarch.actor import endpoint as _monarch_endpoint
    from monarch.actor import this_host as _monarch_this_host
except ImportError as e:  # pragma: no cover - exercised only without torchmonarch
    raise ImportError(
        "FORGE_BACKEND=monarch needs torchmonarch: pip install 'forge[monarch]' "
        "(or pip install torchmonarch==0.7.0), or unset FORGE_BACKEND to use the local backend"
    ) from e

logger = logging.getLogger("controller")

_host_mesh = None  # a Monarch HostMesh set by use_host_mesh(); None means this host
_exit_hook_installed = False


def use_host_mesh(host_mesh) -> None:
    """Place Monarch-backend meshes on ``host_mesh`` (a Monarch ``HostMesh``, e.g.
    ``SlurmJob(...).state().workers``) instead of this host; ``None`` goes back to this host.
    ``options(hosts=N)`` then uses the first N hosts of it."""
    global _host_mesh
    _host_mesh = host_mesh


def _ip_towards(peer: str) -> str:
    """This host's address on the interface that routes to ``peer`` (no packet is sent)."""
    if peer.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


class _Bootstrap(_MonarchActor):
    """Runs in each Monarch process: starts one Forge worker and watches it.

    Endpoints (all async: Monarch 0.7.0 refuses actors that mix kinds), called by
    ``spawn_monarch`` / ``MonarchProc`` in the controller:
    ``pick_master`` (rank 0, call_one), ``start`` (call), ``wait_exit`` (call_one, long poll,
    concurrent), ``signal`` (broadcast)."""

    def __init__(self):
        self._proc: LocalProc | None = None
        self._done: asyncio.Future | None = None

    @_monarch_endpoint
    async def pick_master(self, peer: str) -> tuple[str, int]:
        """MASTER_ADDR/MASTER_PORT for torch.distributed: this host and a free port on it."""
        return _ip_towards(peer), free_port()

    @_monarch_endpoint
    async def start(self, mesh: str, rank_vars: list, sys_path: list, peer: str) -> tuple:
        """Start the worker of this rank; returns (rank, address, pid, hostname)."""
        rank = _monarch_rank().rank
        for p in reversed(sys_path):  # LocalProc hands our sys.path on to the worker
            if p not in sys.path:
                sys.path.insert(0, p)
        env_vars = dict(rank_vars[rank])
        if not os.path.isdir(env_vars[ENV_DIR]):  # another host: a private session dir of our own
            env_vars[ENV_DIR] = _runtime.make_session_dir()
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()

        def on_exit(p: LocalProc) -> None:
            loop.call_soon_threadsafe(
                lambda: self._done.done() or self._done.set_result(p.returncode)
            )

        address = f"tcp:{_ip_towards(peer)}:0"  # port 0: the worker reports the one it got
        env_vars["FORGE_ADDRESS"] = address
        self._proc = LocalProc(mesh, rank, len(rank_vars), address, env_vars, on_exit)
        await self._proc.wait_ready()
        return rank, self._proc.address, self._proc.pid, os.getpid(), socket.gethostname()

    @concurrent_endpoint
    async def wait_exit(self) -> int | None:
        """Answers when the worker exits, with its returncode (negative: killed by signal)."""
        return await asyncio.shield(self._done)

    @_monarch_endpoint
    async def signal(self, sig: int) -> None:
        if self._proc is not None:
            self._proc.signal(sig)

    async def __cleanup__(self, exc) -> None:
        # Monarch is stopping this process: take the worker along now rather than wait for
        # the lifeline to close.
        if self._proc is not None:
            self._proc.stopping = True
            self._proc.signal(signal.SIGKILL)


class MonarchProc(WatchedProc):
    """Controller-side handle of one worker started by a bootstrap actor (``WatchedProc``)."""

    gone = "its Monarch process ended"

    def __init__(self, mesh, rank, size, address, pid, boot_pid, host, boot, on_exit):
        self.boot_pid = boot_pid  # its Monarch process
        self._boot = boot  # the bootstrap actor of this rank only
        super().__init__(mesh, rank, size, address, pid, host, on_exit)

    def _wait_exit(self) -> int | None:
        return self._boot.wait_exit.call_one().get()

    def _send_signal(self, sig: int) -> None:
        try:
            self._boot.signal.broadcast(sig)
        except Exception as e:  # noqa: BLE001 - the process is gone or Monarch shut down
            logger.debug("could not signal %s: %s", self.describe(), e)


class MonarchProcMesh(ProcMesh):
    """A ``ProcMesh`` whose processes Monarch placed; ``stop()`` stops the Monarch mesh too."""

    def __init__(self, name: str, shape: Shape, procs: list[MonarchProc], monarch_procs):
        super().__init__(name, shape, procs)
        self._monarch_procs = monarch_procs

    @property
    def monarch_pids(self) -> list[int]:
        """Pids of the Monarch processes hosting the workers (on their own hosts)."""
        return [p.boot_pid for p in self._procs]

    def stop(self) -> Future[None]:
        """Ask every worker to exit, then stop the Monarch processes (which kills any worker
        still running), and wait for the exits to be reported."""

        async def run():
            if self._stopped:
                return
            self._stopped = True
            for p in self._procs:
                p.stopping = True
            await asyncio.gather(*(self._ask_exit(r) for r in range(len(self._procs))))
            try:
                await self._monarch_procs.stop()
            except Exception as e:  # noqa: BLE001 - already gone; the waits below still tell
                logger.warning("stopping Monarch proc mesh %s: %s", self.name, e)
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(None, p.wait, 5.0) for p in self._procs))
            rt = get_runtime()
            for p in self._procs:
                rt.local_procs.pop(p.address, None)
            if self in rt.proc_meshes:
                rt.proc_meshes.remove(self)

        return Future(run, f"stop {self.name}")


def _host_mesh_for(hosts: int):
    if _host_mesh is None:
        if hosts > 1:
            raise ValueError(
                f"options(hosts={hosts}) with FORGE_BACKEND=monarch needs a multi-host Monarch "
                "HostMesh: call controller._backend.use_host_mesh(job.state().<mesh>) first "
                "(see docs/multihost.md)"
            )
        return _monarch_this_host(), True
    available = _host_mesh.size("hosts")
    if hosts > available:
        raise ValueError(
            f"options(hosts={hosts}) but the Monarch host mesh has {available} hosts; "
            "ask for fewer hosts or allocate more"
        )
    return _host_mesh.slice(hosts=slice(0, hosts)), False


async def spawn_monarch(
    hosts: int, per_host: dict[str, int], env_vars: dict[str, str], name: str
) -> MonarchProcMesh:
    """Start ``hosts`` x ``per_host`` Forge workers on Monarch processes."""
    global _exit_hook_installed
    rt = get_runtime()
    install_signal_handlers()
    host_mesh, local = _host_mesh_for(hosts)  # this_host() starts Monarch's client
    if not _exit_hook_installed:
        # Registered after the Monarch client's exit hook, so it runs first: Monarch then tears
        # its processes down, and the workers' deaths are expected, not failures to report.
        atexit.register(_mark_all_stopping)
        _exit_hook_installed = True
    sizes = mesh_sizes(hosts, per_host)
    mesh_name = rt.unique_name(name)
    peer = "127.0.0.1" if local else _ip_towards("10.255.255.255")
    mpm = host_mesh.spawn_procs(per_host=per_host, name=mesh_name)
    try:
        boot = mpm.spawn("forge_bootstrap", _Bootstrap).flatten("rank")
        master = await boot.slice(rank=0).pick_master.call_one(peer)
        rank_vars = worker_env_vars(
            rt.session.env_vars(), mesh_name, sizes, tuple(master), env_vars
        )
        sys_path = [p for p in sys.path if p]
        try:
            started = (await boot.start.call(mesh_name, rank_vars, sys_path, peer)).values()
        except Exception as e:
            raise SpawnError(f"Monarch mesh {mesh_name!r} failed to start its workers: {e}") from e
    except BaseException:
        await _stop_quietly(mpm)
        raise
    holder: list[MonarchProcMesh] = []

    def on_exit(p: MonarchProc) -> None:
        if holder:
            holder[0]._on_proc_exit(p)

    procs = [
        MonarchProc(
            mesh_name, r, len(rank_vars), addr, pid, bpid, host, boot.slice(rank=r), on_exit
        )
        for r, addr, pid, bpid, host in sorted(started)
    ]
    for p in procs:
        rt.local_procs[p.address] = p  # Client._death_error asks it for the exit status
    pm = MonarchProcMesh(mesh_name, Shape.full(sizes), procs, mpm)
    holder.append(pm)
    for p in procs:  # a worker that died between ready and now
        if p.exited:
            pm._on_proc_exit(p)
    rt.proc_meshes.append(pm)
    return pm


def _mark_all_stopping() -> None:
    rt = _runtime._runtime  # not get_runtime(): never start a runtime at exit
    if rt is None:
        return
    for p in list(rt.local_procs.values()):
        if isinstance(p, MonarchProc):
            p.stopping = True


async def _stop_quietly(mpm) -> None:
    try:
        await mpm.stop()
    except Exception as e:  # noqa: BLE001 - the original error matters more
        logger.warning("stopping a Monarch proc mesh after a failed start: %s", e)


async def launch(opts, name: str) -> MonarchProcMesh:
    """The launcher interface (``controller._launch``)."""
    if opts.with_gpus:
        raise ValueError(
            "with_gpus=True is provisioned by the local and ray backends; on Monarch the "
            "allocator's hosts own their GPUs"
        )
    return await spawn_monarch(opts.hosts or 1, {"procs": opts.procs}, dict(opts.env_vars), name)
