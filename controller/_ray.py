"""The Ray backend (``FORGE_BACKEND=ray``): Forge workers placed and watched by Ray.

Ray decides *where* ranks run and tells when a node or process is gone; Forge's own protocol
still carries every call::

    controller ──Ray──> placement group (a bundle per host of the mesh)
                           └─ Ray actor ``_RankHost`` (one per rank, in its bundle)
                                └─ child: python -m controller._worker   (tcp:<node ip>:<port>)
    controller ──Forge TCP (HMAC-authenticated)──> worker

- **Cluster.** With ``RAY_ADDRESS`` set (Ray's own convention) the controller joins that
  cluster; without it, it starts a Ray instance on this host (``HEALTH``: a node that stops
  answering is declared dead within about 6 s). Every node needs the same Python environment
  and code at the same paths (the controller's ``sys.path`` is handed to the workers).
- **Placement.** A mesh is one placement group: ``hosts=1`` is one bundle on one node,
  ``hosts=N`` N bundles on N distinct nodes (``STRICT_SPREAD``); each rank reserves
  ``FORGE_RAY_CPUS`` logical CPUs (and one GPU with ``with_gpus``; Ray sets the rank's
  ``CUDA_VISIBLE_DEVICES``). Replicas of a service are spread: each goes to a live node with
  room for it (Ray's available resources per node) and, among those, the one with the fewest
  live replicas of that service (one per node, round robin), pinned by Ray's
  ``ray.io/node-id`` label. Meshes that are not replicas (trainer, replay buffer, data) keep
  together on the node the first of them got (a soft hint: elsewhere if it is full or dead),
  so one host holds the run's state and the others only replicas.
- **Death.** A worker that exits is reported with its exit status by its ``_RankHost``; a
  ``_RankHost`` whose node died (Ray's health check) is reported as lost. Either way the mesh's
  death callbacks run and the calls in flight to that worker fail at once (``ActorDiedError``,
  re-sent elsewhere by services), without waiting for TCP.
- **Lifetime.** The Ray actors and placement groups belong to the controller's Ray job: when
  the controller exits (or is killed) Ray stops them, and each worker follows its
  ``_RankHost`` through the lifeline pipe of ``controller._local``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import shutil
import socket
import sys
import time

from controller import _reaper, _runtime
from controller import env_vars as forge_vars
from controller._home import start_home
from controller._launch import WatchedProc, mesh_sizes, worker_env_vars
from controller._local import LocalProc, free_port
from controller._runtime import ENV_DIR, get_runtime, install_signal_handlers, make_session_dir
from controller.errors import SpawnError
from controller.mesh import ProcMesh
from controller.shape import Shape

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as e:  # pragma: no cover - exercised only without ray
    raise ImportError(
        "FORGE_BACKEND=ray needs Ray: pip install 'forge[ray]' (or pip install 'ray==2.60.*'), "
        "or unset FORGE_BACKEND to use the local backend"
    ) from e

logger = logging.getLogger("controller")

# Ray's node failure detector, for the Ray instance the controller starts itself: a node whose
# raylet misses 5 checks 1 s apart is dead. A cluster started by hand takes the same values
# from ``ray start --head --system-config='<json>'`` (docs/multihost.md).
HEALTH = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
LOCAL_CPUS = 64  # logical CPU slots of a local instance: ranks mostly wait (threads: budget)
PLACE_TIMEOUT_S = 120.0  # a placement group's resources, then a worker's start-up
NODE_LABEL = "ray.io/node-id"
_reaper_proc = None  # the reaper of a Ray instance this process started


def connect() -> None:
    """Join the cluster in ``RAY_ADDRESS``, or start a Ray instance on this host."""
    if ray.is_initialized():
        return
    address = forge_vars.ray_address()
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    common = dict(
        namespace="forge",
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
    )
    if address:
        try:
            ray.init(address=address, **common)
        except Exception as e:  # noqa: BLE001 - Ray's own error, named and kept as the cause
            raise SpawnError(
                f"FORGE_BACKEND=ray could not join the Ray cluster at RAY_ADDRESS={address}: "
                f"{_first_line(e)}. Check the address, that the head runs, and that "
                "RAY_AUTH_MODE/RAY_AUTH_TOKEN match the cluster's"
            ) from e
    else:
        before = set(_reaper.descendants(os.getpid()))
        ray.init(
            address="local",
            num_cpus=max(LOCAL_CPUS, os.cpu_count() or 1),
            include_dashboard=False,
            _system_config=HEALTH,
            **common,
        )
        # Ray's agents outlive a SIGKILLed driver: a reaper takes the instance down with us
        global _reaper_proc
        _reaper_proc = _reaper.watch(sorted(set(_reaper.descendants(os.getpid())) - before))
    atexit.register(_mark_all_stopping)  # runs before Ray's own exit hook stops our actors
    start_home(ray.util.get_node_ip_address())  # workers elsewhere reach this host through it


class _RankHost:
    """Runs in a Ray actor process, one per rank: starts that rank's Forge worker and reports
    its exit. Every method is async (one event loop: ``wait_exit`` long-polls beside them)."""

    def __init__(self):
        self._proc: LocalProc | None = None
        self._done: asyncio.Future | None = None

    async def place(self) -> tuple[str, int, str]:
        """This node's IP (as Ray knows it), a free port on it, and its host name."""
        return ray.util.get_node_ip_address(), free_port(), socket.gethostname()

    async def start(self, mesh: str, rank: int, size: int, env_vars: dict, cwd: str) -> tuple:
        """Start the worker in the controller's working directory ``cwd`` where it exists
        here (relative paths then mean what they mean to the controller); returns (address,
        pid, host name, Ray node id, our own pid)."""
        if os.path.isdir(cwd):
            os.chdir(cwd)  # this process hosts this one rank only
        env_vars = dict(env_vars)
        private = None
        if not os.path.isdir(env_vars[ENV_DIR]):  # another host: a private session dir of ours
            private = env_vars[ENV_DIR] = make_session_dir()
        gpus = ray.get_gpu_ids()
        if gpus:
            env_vars["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()

        def on_exit(p: LocalProc) -> None:
            if private:
                shutil.rmtree(private, ignore_errors=True)
            loop.call_soon_threadsafe(
                lambda: self._done.done() or self._done.set_result(p.returncode)
            )

        env_vars["FORGE_ADDRESS"] = f"tcp:{ray.util.get_node_ip_address()}:0"  # port: worker's
        self._proc = LocalProc(mesh, rank, size, env_vars["FORGE_ADDRESS"], env_vars, on_exit)
        await self._proc.wait_ready()
        node_id = ray.get_runtime_context().get_node_id()
        return self._proc.address, self._proc.pid, socket.gethostname(), node_id, os.getpid()

    async def wait_exit(self) -> int | None:
        """Answers when the worker exits, with its returncode (negative: killed by signal)."""
        return await asyncio.shield(self._done)

    async def signal(self, sig: int) -> None:
        if self._proc is not None:
            self._proc.signal(sig)


_remote_host = None


def _rank_host_class():
    global _remote_host
    if _remote_host is None:
        _remote_host = ray.remote(max_restarts=0, max_task_retries=0)(_RankHost)
    return _remote_host


class RayProc(WatchedProc):
    """Controller-side handle of one worker started by a ``_RankHost`` (``WatchedProc``)."""

    gone = "its Ray actor is gone"

    def __init__(self, mesh, rank, size, started, actor, on_exit):
        address, pid, host, self.node_id, self.host_pid = started
        self.actor = actor
        super().__init__(mesh, rank, size, address, pid, host, on_exit)

    def _wait_exit(self) -> int | None:
        while True:
            try:
                return ray.get(self.actor.wait_exit.remote())
            except ray.exceptions.ActorUnavailableError:  # a blip; Ray decides if it is dead
                time.sleep(0.2)

    def _send_signal(self, sig: int) -> None:
        try:
            self.actor.signal.remote(sig)  # fire and forget
        except Exception as e:  # noqa: BLE001 - the actor (or its node) is gone already
            logger.debug("mesh %s rank %d: no signal sent (%s)", self.mesh, self.rank, e)


class RayProcMesh(ProcMesh):
    """A ``ProcMesh`` whose ranks Ray placed; stopping it also removes the Ray actors and the
    placement group."""

    def __init__(self, name: str, shape: Shape, procs: list[RayProc], pg, spread_key):
        super().__init__(name, shape, procs)
        self._pg = pg
        self.spread_key = spread_key

    def _on_proc_exit(self, proc) -> None:
        if not (proc.stopping or self._stopped):
            _suspect[proc.node_id] = time.monotonic()
        super()._on_proc_exit(proc)

    @property
    def node_ids(self) -> list[str]:
        """The Ray node of each rank."""
        return [p.node_id for p in self._procs]

    @property
    def host_pids(self) -> list[int]:
        """Pids of the Ray actor processes hosting the workers (on their own nodes)."""
        return [p.host_pid for p in self._procs]

    async def _end_processes(self) -> None:
        """Kill the Ray actors (a worker still running follows through its lifeline), free
        the placement group, and wait for the exits to be reported."""
        _release(self._pg, [p.actor for p in self._procs])
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, p.wait, 5.0) for p in self._procs))


def _release(pg, actors) -> None:
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception as e:  # noqa: BLE001 - already gone
            logger.debug("ray.kill: %s", e)
    try:
        remove_placement_group(pg)
    except Exception as e:  # noqa: BLE001 - already removed, or Ray is shutting down
        logger.debug("remove_placement_group: %s", e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


_REPLICA = re.compile(r"-r\d+$")


SUSPECT_S = 30.0  # after a rank dies unexpectedly, its node gets no new rank for this long
_suspect: dict[str, float] = {}  # node id -> when a Forge rank last died there unexpectedly


def live_nodes() -> list[dict]:
    """The cluster's live nodes that offer CPUs, in a stable order (by IP, then node id),
    without those where a rank just died (Ray may not have declared a lost host dead yet)
    unless that leaves none."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    now = time.monotonic()
    trusted = [n for n in nodes if now - _suspect.get(n["NodeID"], -SUSPECT_S) >= SUSPECT_S]
    return sorted(trusted or nodes, key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))


def _fits(free: dict, need: dict) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def choose_node(
    nodes: list[dict], free: dict[str, dict], load: dict[str, int], need: dict
) -> tuple[str, str]:
    """Where a replica needing ``need`` (a bundle, e.g. ``{"CPU": 1.0}``) goes: among the
    ``nodes`` (in order) whose ``free`` resources hold it, the one with the fewest replicas of
    its service (``load``; ties: node order). ``(node id, "")``; or, when no node has room
    now, ``(node id, why it is full)`` for the node with the fewest replicas (the caller waits
    there, bounded, in case room frees up)."""
    if not nodes:
        raise SpawnError("the Ray cluster has no live node with CPUs to place a replica on")
    ids = [n["NodeID"] for n in nodes]
    room = [i for i, nid in enumerate(ids) if _fits(free.get(nid, {}), need)]
    order = sorted(room or range(len(ids)), key=lambda i: (load.get(ids[i], 0), i))
    best = nodes[order[0]]
    if room:
        return best["NodeID"], ""
    why = _why_full(best, free.get(best["NodeID"], {}), need)
    return best["NodeID"], f"no live node has room: {why}"


def _why_full(node: dict, free: dict, need: dict) -> str:
    total = node.get("Resources", {})
    short = {k: round(free.get(k, 0.0), 3) for k in need}
    return (
        f"node {node['NodeID'][:12]} ({node.get('NodeManagerAddress', '?')}) has {short} free "
        f"of { {k: total.get(k, 0.0) for k in need} } and the replica needs {need}"
    )


def pick_node(
    spread_key: str, meshes: list, placing: dict[str, int], need: dict
) -> tuple[str, str]:
    """A live node with room for ``need`` (Ray's available resources per node, less what is
    being placed now) and the fewest live replicas of ``spread_key``; see ``choose_node``."""
    nodes = live_nodes()
    load = {n["NodeID"]: placing.get(f"{spread_key}@{n['NodeID']}", 0) for n in nodes}
    for pm in meshes:
        if getattr(pm, "spread_key", None) == spread_key and not pm._stopped:
            for p in pm._procs:
                if p.node_id in load and not p.exited:
                    load[p.node_id] += 1
    free = ray._private.state.available_resources_per_node() if nodes else {}
    for node, held in _reserved.items():  # placements made but not yet in Ray's numbers
        if node in free:
            free[node] = {k: v - held.get(k, 0.0) for k, v in free[node].items()}
    return choose_node(nodes, free, load, need)


def _anchor_node(rt) -> str | None:
    """The node the run's single actors share: the first live node, kept while it lives."""
    live = [n["NodeID"] for n in live_nodes()]
    if _anchor.get(id(rt)) not in live:
        _anchor[id(rt)] = live[0] if live else None
    return _anchor[id(rt)]


_placing: dict[str, int] = {}  # "<spread key>@<node id>" -> replicas being placed there now
_reserved: dict[str, dict[str, float]] = {}  # node id -> resources of groups placed there now
_anchor: dict[int, str] = {}  # id(runtime) -> the node its single-host, non-replica meshes share


async def _place(rt, mesh_name, sizes, bundle, resources, spread_key, env_vars):
    """One placement group for the mesh and a ``_RankHost`` per rank, started."""
    hosts, per_host = sizes.get("hosts", 1), sizes["procs"]
    cpus, gpus = resources
    node, full = pick_node(spread_key, rt.proc_meshes, _placing, bundle) if spread_key else ("", "")
    if full:
        logger.warning("mesh %s: %s; waiting for room there", mesh_name, full)
    anchor = _anchor_node(rt) if not spread_key and hosts == 1 else None
    held = f"{spread_key}@{node}"
    # what this group will take on its node counts against that node until Ray's numbers
    # show it, so that replicas placed at the same time do not all pick the same room
    at = node or anchor
    if node:
        _placing[held] = _placing.get(held, 0) + 1
    if at:
        _reserve(at, bundle, 1)
    reserved = bool(at)
    try:
        pg = placement_group(
            [dict(bundle) for _ in range(hosts)],
            strategy="STRICT_SPREAD" if hosts > 1 else "STRICT_PACK",
            name=f"forge-{mesh_name}-{os.getpid()}",
            bundle_label_selector=[{NODE_LABEL: node}] if node else None,
            _soft_target_node_id=anchor,
        )
        actors = []
        try:
            await _await_placed(pg, node, mesh_name, hosts, bundle)
            if reserved:  # placed: Ray's own numbers count it from now on
                _reserve(at, bundle, -1)
                reserved = False
            cls = _rank_host_class()
            actors = [
                cls.options(
                    num_cpus=cpus,
                    num_gpus=gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=r // per_host
                    ),
                ).remote()
                for r in range(hosts * per_host)
            ]
            started = await _start_ranks(rt, actors, mesh_name, sizes, env_vars)
        except BaseException:
            _release(pg, actors)
            raise
    finally:
        if node:
            _placing[held] -= 1
        if reserved:
            _reserve(at, bundle, -1)
    return pg, actors, started


def _reserve(node: str, bundle: dict, sign: int) -> None:
    held = _reserved.setdefault(node, {})
    for k, v in bundle.items():
        held[k] = held.get(k, 0.0) + sign * v
    if all(abs(v) < 1e-9 for v in held.values()):
        del _reserved[node]


async def launch(opts, name: str) -> RayProcMesh:
    """Start ``opts.hosts`` x ``opts.procs`` workers on the Ray cluster (the launcher
    interface of ``controller._launch``)."""
    rt = get_runtime()
    install_signal_handlers()
    connect()  # blocks this loop for Ray's start-up, once
    hosts, per_host = opts.hosts or 1, opts.procs
    sizes = mesh_sizes(hosts, {"procs": per_host})
    mesh_name = rt.unique_name(name)
    cpus, gpus = forge_vars.ray_cpus(), (1 if opts.with_gpus else 0)
    bundle = {"CPU": cpus * per_host} | ({"GPU": gpus * per_host} if gpus else {})
    spread_key = _REPLICA.sub("", name) if opts.num_replicas > 1 and hosts == 1 else None
    for attempt in range(3):  # a pinned node that dies meanwhile: place the mesh again
        try:
            pg, actors, started = await _place(
                rt, mesh_name, sizes, bundle, (cpus, gpus), spread_key, dict(opts.env_vars)
            )
            break
        except _NodeLost as e:
            _suspect[e.node] = time.monotonic()
            if attempt == 2:
                raise
    holder: list[RayProcMesh] = []

    def on_exit(p: RayProc) -> None:
        if holder:
            holder[0]._on_proc_exit(p)

    n = len(actors)
    procs = [
        RayProc(mesh_name, r, n, tuple(info), actors[r], on_exit) for r, info in enumerate(started)
    ]
    for p in procs:
        rt.local_procs[p.address] = p  # Client._death_error asks it for the exit status
    pm = RayProcMesh(mesh_name, Shape.full(sizes), procs, pg, spread_key)
    holder.append(pm)
    for p in procs:  # a worker that died between ready and now
        if p.exited:
            pm._on_proc_exit(p)
    rt.proc_meshes.append(pm)
    return pm


async def _start_ranks(rt, actors, mesh_name, sizes, env_vars) -> list[tuple]:
    """Start each rank's worker; (address, pid, host name, node id, host pid) per rank."""
    ip, port, _ = await _await_ref(actors[0].place.remote(), PLACE_TIMEOUT_S, "")
    home = {forge_vars.HOME: rt.session.home}  # ranks elsewhere reach this host through it
    rank_vars = worker_env_vars(
        rt.session.env_vars() | home, mesh_name, sizes, (ip, port), env_vars
    )
    n = len(actors)
    cwd = os.getcwd()
    refs = [a.start.remote(mesh_name, r, n, rank_vars[r], cwd) for r, a in enumerate(actors)]
    what = f"mesh {mesh_name!r}: a worker did not start within {PLACE_TIMEOUT_S:.0f} s"
    try:
        started = await asyncio.gather(*(_await_ref(ref, PLACE_TIMEOUT_S, what) for ref in refs))
    except SpawnError:
        raise
    except Exception as e:  # noqa: BLE001 - a start-up failure inside the Ray actor
        raise SpawnError(f"Ray mesh {mesh_name!r} failed to start its workers: {e}") from e
    return list(started)


def _no_room(mesh: str, hosts: int, bundle: dict, node: str | None = None) -> str:
    avail = ray.available_resources()
    where = ""
    if node:  # a replica pinned to one node: say which, and what it has
        info = next((n for n in ray.nodes() if n["NodeID"] == node), {"NodeID": node})
        free = ray._private.state.available_resources_per_node().get(node, {})
        where = f"; it was pinned to {_why_full(info, free, bundle)}"
    return (
        f"the Ray cluster has no room for mesh {mesh!r}: it needs {hosts} node(s) with "
        f"{bundle} free each (available now, whole cluster: "
        f"{ {k: v for k, v in avail.items() if k in ('CPU', 'GPU')} }){where}; add nodes, "
        "or lower FORGE_RAY_CPUS"
    )


async def _await_placed(pg, node: str | None, mesh: str, hosts: int, bundle: dict) -> None:
    """Wait for the placement group (bounded); a group pinned to ``node`` fails at once when
    that node dies meanwhile (the caller places the mesh again elsewhere)."""
    ready = asyncio.wrap_future(pg.ready().future())
    deadline = time.monotonic() + PLACE_TIMEOUT_S
    while True:
        done, _ = await asyncio.wait({ready}, timeout=1.0)
        if done:
            ready.result()
            return
        if node and node not in {n["NodeID"] for n in ray.nodes() if n.get("Alive")}:
            ready.cancel()
            raise _NodeLost(node, f"node {node} died while mesh {mesh!r} was being placed there")
        if time.monotonic() > deadline:
            ready.cancel()
            raise SpawnError(_no_room(mesh, hosts, bundle, node))


class _NodeLost(SpawnError):
    """The node a mesh was pinned to died while it was being placed."""

    def __init__(self, node: str, message: str):
        super().__init__(message)
        self.node = node


async def _await_ref(ref, timeout: float, what: str):
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
    except asyncio.TimeoutError:
        raise SpawnError(what or f"Ray did not answer within {timeout:.0f} s") from None


def _mark_all_stopping() -> None:
    rt = _runtime._runtime  # not get_runtime(): never start a runtime at exit
    if rt is None:
        return
    for p in list(rt.local_procs.values()):
        if isinstance(p, RayProc):
            p.stopping = True
