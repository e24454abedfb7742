"""The hosts backend (``FORGE_BACKEND=hosts``): Forge workers started by host agents over TCP.

On every host, a host agent listens on TCP with a shared secret (see docs/multihost.md)::

    python -m controller._hosts --listen tcp:10.77.0.2:7100 --key-file /etc/forge/hosts.key

The controller names the agents and the secret::

    FORGE_BACKEND=hosts FORGE_HOSTS=10.77.0.2:7100,10.77.0.3:7100 \\
        FORGE_HOSTS_KEY_FILE=/etc/forge/hosts.key python my_program.py

    controller ──(HMAC-authenticated TCP, key file)──> host agent ──spawns──> python -m controller._worker
    controller ──Forge protocol (HMAC, session key)──> worker on tcp:<host ip>:<port>

Each connection to an agent starts with the same mutual HMAC challenge-response as every Forge
channel (``_wire``), keyed by the key file: nothing is unpickled before the controller proved it
holds the secret. Requests are ``(op, args)`` pickles: ``start`` a worker (answers its address
and pid), ``wait`` for a worker's exit (long poll), ``signal`` one, ``free_port``.

Placement (the provisioner): a mesh of ``options(hosts=N)`` goes on N distinct live hosts.
Service replicas spread: each goes to the live host with the fewest live replicas of the same
service (so a 2-replica service spans 2 hosts); other meshes go to the first live host(s) in
``FORGE_HOSTS`` order (the "head"). A host whose agent cannot be reached, or whose connection
drops, is dead for this controller: restarts go to the others.

Death: a worker's death reaches callers as EOF on its connection (``ActorDiedError``) and its
exit status through ``wait``. When a whole host dies, the agent's connection drops and every
worker on it is reported dead ("host ... is unreachable"). When the controller's connection to
an agent drops (the controller died), the agent kills the workers it started for it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading

from controller import _serialization as ser
from controller import _wire, loops
from controller import env as forge_env
from controller._launch import mesh_sizes, rank_envs
from controller._local import LocalProc, free_port
from controller._runtime import ENV_DIR, get_runtime, install_signal_handlers
from controller.errors import SpawnError, describe_exit
from controller.mesh import ProcMesh
from controller.shape import Shape

logger = logging.getLogger("controller")

ENV_HOSTS = "FORGE_HOSTS"
ENV_KEY_FILE = "FORGE_HOSTS_KEY_FILE"
AGENT_TIMEOUT_S = 10.0  # connecting to an agent and asking it something quick
START_TIMEOUT_S = 120.0  # a worker's start-up (imports) on a loaded host


# -- configuration -------------------------------------------------------------------------
def read_key_file(path: str) -> bytes:
    """The shared secret in ``path``, which only its owner may read (mode 0600)."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise ValueError(f"{ENV_KEY_FILE}: cannot read the host key file {path!r}: {e}") from e
    if st.st_mode & 0o077:
        raise ValueError(
            f"{ENV_KEY_FILE}: {path!r} is readable by others (mode {st.st_mode & 0o777:o}); "
            f"run: chmod 600 {path}"
        )
    if len(key) < 16:
        raise ValueError(f"{ENV_KEY_FILE}: {path!r} holds {len(key)} bytes; use 16 or more")
    return key


def parse_hosts(raw: str) -> list[str]:
    """``"10.0.0.2:7100,10.0.0.3:7100"`` (``tcp:`` prefixes allowed) -> tcp addresses."""
    out = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        addr = part if part.startswith("tcp:") else f"tcp:{part}"
        host, _, port = addr[4:].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(
                f"{ENV_HOSTS}: {part!r} is not host:port; expected e.g. "
                f"{ENV_HOSTS}=10.0.0.2:7100,10.0.0.3:7100"
            )
        out.append(addr)
    if not out:
        raise ValueError(f"FORGE_BACKEND=hosts needs {ENV_HOSTS}=host:port[,host:port...]")
    return out


# -- the agent (runs on each host) ---------------------------------------------------------
class HostAgent:
    """Starts Forge workers for authenticated controllers and reports their exits."""

    def __init__(self, listen: str):
        self.listen = listen
        self.procs: dict[int, LocalProc] = {}
        self._owner: dict[int, _wire.FrameProtocol] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self.loop = asyncio.get_running_loop()

    def on_frame(self, proto, kind: int, cid: int, body) -> None:
        if kind == _wire.CALL:
            self.loop.create_task(self._handle(proto, cid, body))

    async def _handle(self, proto, cid: int, body) -> None:
        try:
            op, args = ser.loads(body)
            if op == "start":
                value = await self._start(proto, *args)
            elif op == "wait":
                value = await asyncio.shield(self._exits[args[0]])
            elif op == "signal":
                proc = self.procs.get(args[0])
                if proc is not None:
                    proc.signal(args[1])
                value = None
            elif op == "free_port":
                value = free_port()
            else:
                raise ValueError(f"unknown host agent request {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the controller as text
            if not proto.closed:
                proto.send(_wire.ERR, cid, ser.dumps(f"{type(e).__name__}: {e}")[0])
            return
        if not proto.closed:
            proto.send(_wire.OK, cid, ser.dumps(value, use_shm=False)[0])

    async def _start(self, proto, mesh: str, rank: int, size: int, env: dict, sys_path: list):
        for p in reversed(sys_path):  # LocalProc hands our sys.path on to the worker
            if p not in sys.path:
                sys.path.insert(0, p)
        env = dict(env)
        if not os.path.isdir(env.get(ENV_DIR, "")):  # no shared filesystem: a dir of our own
            env[ENV_DIR] = tempfile.mkdtemp(prefix=f"forge-{os.getpid()}-")
        ip = _wire.parse_address(self.listen)[1][0]
        if ip in ("0.0.0.0", ""):
            ip = _ip_towards(proto.transport.get_extra_info("peername")[0])
        env["FORGE_ADDRESS"] = f"tcp:{ip}:0"  # port 0: the worker reports the one it got
        done = self.loop.create_future()

        def on_exit(p: LocalProc) -> None:
            self.loop.call_soon_threadsafe(lambda: done.done() or done.set_result(p.returncode))

        proc = LocalProc(mesh, rank, size, env["FORGE_ADDRESS"], env, on_exit)
        self.procs[proc.pid] = proc
        self._owner[proc.pid] = proto
        self._exits[proc.pid] = done
        done.add_done_callback(lambda _: self._forget(proc.pid))
        if proto.closed:  # the controller left while we were starting
            proc.signal(signal.SIGKILL)
        await proc.wait_ready(START_TIMEOUT_S)
        return proc.address, proc.pid, socket.gethostname()

    def _forget(self, pid: int) -> None:
        self.procs.pop(pid, None)
        self._owner.pop(pid, None)
        self.loop.call_later(60, self._exits.pop, pid, None)  # late ``wait`` calls still answer

    def on_lost(self, proto, exc) -> None:
        """A controller's connection dropped: it died or left, so its workers go too."""
        for pid, owner in list(self._owner.items()):
            if owner is proto:
                self.procs[pid].stopping = True
                self.procs[pid].signal(signal.SIGKILL)

    def kill_all(self) -> None:
        for proc in list(self.procs.values()):
            proc.signal(signal.SIGKILL)


def _ip_towards(peer: str) -> str:
    """This host's address on the interface that routes to ``peer`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


async def serve_agent(listen: str, key: bytes) -> None:
    """Run a host agent on ``listen`` (``tcp:ip:port``) until SIGTERM/SIGINT."""
    agent = HostAgent(listen)
    server = await _wire.serve(listen, key, agent.on_frame, agent.on_lost)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        agent.loop.add_signal_handler(sig, stop.set)
    print(f"forge host agent listening on {listen} (pid {os.getpid()})", flush=True)
    try:
        async with server:
            await stop.wait()
    finally:
        agent.kill_all()


# -- the controller's side -----------------------------------------------------------------
class AgentConnection:
    """The controller's authenticated channel to one host agent (lives on the runtime's
    background loop)."""

    def __init__(self, address: str, key: bytes):
        self.address = address
        self._key = key
        self._proto: _wire.FrameProtocol | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.dead = ""  # why this host is unusable ("" while it is usable)

    async def request(self, op: str, *args, timeout: float | None = AGENT_TIMEOUT_S):
        if self.dead:
            raise ConnectionError(self.dead)
        if self._proto is None:
            try:
                self._proto = await _wire.open_channel(
                    self.address, self._key, self._on_frame, self._on_lost, AGENT_TIMEOUT_S
                )
            except (OSError, asyncio.TimeoutError) as e:
                if "authentication" in str(e):
                    why = (
                        f"host agent {self.address} rejected our key: {ENV_KEY_FILE} must hold "
                        "the same secret as the agent's --key-file"
                    )
                else:
                    why = f"host agent {self.address} is unreachable: {e or type(e).__name__}"
                self._mark_dead(why)
                raise ConnectionError(self.dead) from None
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        self._proto.send(_wire.CALL, cid, ser.dumps((op, args), use_shm=False)[0])
        try:
            kind, body = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(cid, None)
        if kind == _wire.ERR:
            raise SpawnError(f"host agent {self.address}: {ser.loads(body)}")
        return ser.loads(body)

    def _on_frame(self, proto, kind, cid, body) -> None:
        fut = self._pending.get(cid)
        if fut is not None and not fut.done():
            fut.set_result((kind, bytes(body)))

    def _on_lost(self, proto, exc) -> None:
        if proto is not self._proto:  # lost during the handshake: ``request`` says why
            return
        self._mark_dead(
            f"host agent {self.address} is unreachable: its connection closed "
            f"({exc or 'host down or agent killed'})"
        )

    def _mark_dead(self, why: str) -> None:
        if not self.dead:
            logger.warning("%s; no more processes will be placed there", why)
            self.dead = why
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))


class HostProc:
    """Controller-side handle of one worker started by a host agent. Offers what ``ProcMesh``
    and the runtime use of a ``LocalProc``: address, pid, rank, stopping, returncode, ``wait``,
    ``signal``, ``describe``."""

    def __init__(self, mesh, rank, size, address, pid, host: AgentConnection, on_exit, loop):
        self.mesh, self.rank, self.size, self.address, self.pid = mesh, rank, size, address, pid
        self.host = host
        self.stopping = False
        self.returncode: int | None = None
        self.lost = ""  # why the exit status is unknown (the host is gone)
        self._loop = loop  # the runtime's background loop, where ``host`` lives
        self._on_exit = on_exit
        self._exited = threading.Event()
        watch = asyncio.run_coroutine_threadsafe(host.request("wait", pid, timeout=None), loop)
        watch.add_done_callback(self._exit_reported)

    def _exit_reported(self, fut) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.lost = str(fut.exception() if not fut.cancelled() else "watch cancelled")
        else:
            self.returncode = fut.result()
        self._exited.set()
        self._on_exit(self)

    def wait(self, timeout: float | None = None) -> int | None:
        self._exited.wait(timeout)
        return self.returncode

    def signal(self, sig: int) -> None:
        if self._exited.is_set() or self._loop.is_closed():
            return
        fut = asyncio.run_coroutine_threadsafe(
            self.host.request("signal", self.pid, sig), self._loop
        )
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # best effort

    def describe(self) -> str:
        state = (
            "alive" if not self._exited.is_set() else (self.lost or describe_exit(self.returncode))
        )
        return (
            f"mesh {self.mesh!r} rank {self.rank} pid {self.pid} on {self.host.address} ({state})"
        )


class HostPool:
    """The agents of ``FORGE_HOSTS`` and the placement of meshes on them (one per runtime)."""

    def __init__(self, addresses: list[str], key: bytes):
        self.hosts = [AgentConnection(a, key) for a in addresses]
        self.placing: dict[tuple[str, int], int] = {}  # (spread key, id(host)) -> meshes starting

    def pick(self, n: int, spread_key: str | None, meshes: list) -> list[AgentConnection]:
        """``n`` distinct live hosts: for a service replica (``spread_key``) the ones with the
        fewest live replicas of that service, else the first live ones in order."""
        live = [h for h in self.hosts if not h.dead]
        if len(live) < n:
            dead = "; ".join(h.dead for h in self.hosts if h.dead)
            raise SpawnError(
                f"a mesh needs {n} host(s) but only {len(live)} of {len(self.hosts)} in "
                f"{ENV_HOSTS} are live" + (f" ({dead})" if dead else "")
            )
        if spread_key is None:
            return live[:n]
        load = {id(h): self.placing.get((spread_key, id(h)), 0) for h in live}
        for pm in meshes:
            if getattr(pm, "spread_key", None) == spread_key and not pm._stopped:
                for p in pm._procs:
                    if id(p.host) in load and not p._exited.is_set():
                        load[id(p.host)] += 1
        order = sorted(range(len(live)), key=lambda i: (load[id(live[i])], i))
        return [live[i] for i in order[:n]]


_pools: dict[int, HostPool] = {}  # id(runtime) -> its pool: a new runtime starts afresh


def host_pool() -> HostPool:
    """This runtime's pool of host agents, from ``FORGE_HOSTS`` and ``FORGE_HOSTS_KEY_FILE``."""
    rt = get_runtime()
    pool = _pools.get(id(rt))
    if pool is None:
        key_file = forge_env.hosts_key_file()
        if not key_file:
            raise ValueError(f"FORGE_BACKEND=hosts needs {ENV_KEY_FILE}=<path of the host key>")
        pool = HostPool(parse_hosts(forge_env.hosts()), read_key_file(key_file))
        _pools.clear()
        _pools[id(rt)] = pool
    return pool


def reset_host_pool() -> None:
    """Forget the agents and which of them are dead (re-read ``FORGE_HOSTS`` on next use)."""
    _pools.clear()


_REPLICA = re.compile(r"-r\d+$")


async def launch(opts, name: str) -> ProcMesh:
    """Start ``opts.hosts`` x ``opts.procs`` workers on the agents' hosts (see module doc);
    the launcher interface (``controller._launch``)."""
    if opts.with_gpus:
        raise ValueError("with_gpus=True is provisioned by the local and ray backends")
    rt = get_runtime()
    install_signal_handlers()
    pool = host_pool()
    n_hosts, per_host = opts.hosts or 1, opts.procs
    sizes = mesh_sizes(n_hosts, {"procs": per_host})
    spread_key = _REPLICA.sub("", name) if opts.num_replicas > 1 else None
    mesh_name = rt.unique_name(name)
    bg = rt.background_loop()
    for _attempt in range(len(pool.hosts) + 1):  # each failure marks a host dead; then pick raises
        hosts = pool.pick(n_hosts, spread_key, rt.proc_meshes)
        keys = [(spread_key, id(h)) for h in hosts] if spread_key else []
        for k in keys:  # replicas start in parallel: count this one before it is running
            pool.placing[k] = pool.placing.get(k, 0) + 1
        run = _start_workers(rt, hosts, mesh_name, sizes, per_host, dict(opts.env))
        try:
            started = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run, bg))
            break
        except ConnectionError:  # a host died on the way: place the mesh again without it
            continue
        finally:
            for k in keys:
                pool.placing[k] -= 1
    else:
        raise SpawnError(f"mesh {mesh_name!r}: every host in {ENV_HOSTS} failed")
    holder: list[ProcMesh] = []

    def on_exit(p: HostProc) -> None:
        if holder:
            holder[0]._on_proc_exit(p)

    procs = [
        HostProc(mesh_name, r, len(started), addr, pid, host, on_exit, bg)
        for r, (host, addr, pid) in enumerate(started)
    ]
    for p in procs:
        rt.local_procs[p.address] = p  # Client._death_error asks it for the exit status
    pm = ProcMesh(mesh_name, Shape.full(sizes), procs)
    pm.spread_key = spread_key
    holder.append(pm)
    for p in procs:  # a worker that died between ready and now
        if p._exited.is_set():
            pm._on_proc_exit(p)
    rt.proc_meshes.append(pm)
    return pm


async def _start_workers(rt, hosts, mesh_name, sizes, per_host, env) -> list[tuple]:
    """Ask the agents to start every rank (on the background loop); on failure stop those that
    started and raise (``ConnectionError`` if a host was lost, so the caller can re-place)."""
    n = len(hosts) * per_host
    master_ip = _wire.parse_address(hosts[0].address)[1][0]
    master_port = await hosts[0].request("free_port")
    sys_path = [p for p in sys.path if p]
    envs = rank_envs(rt.session.env(), mesh_name, sizes, (master_ip, master_port), env)
    reqs = [
        hosts[rank // per_host].request(
            "start", mesh_name, rank, n, envs[rank], sys_path, timeout=START_TIMEOUT_S + 5
        )
        for rank in range(n)
    ]
    results = await asyncio.gather(*reqs, return_exceptions=True)
    errors = [e for e in results if isinstance(e, BaseException)]
    if errors:
        for rank, res in enumerate(results):
            if not isinstance(res, BaseException):
                h = hosts[rank // per_host]
                await asyncio.gather(h.request("signal", res[1], 9), return_exceptions=True)
        lost = [e for e in errors if isinstance(e, ConnectionError)]
        raise lost[0] if lost else errors[0]
    return [(hosts[r // per_host], addr, pid) for r, (addr, pid, _host) in enumerate(results)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m controller._hosts", description="Run a Forge host agent."
    )
    p.add_argument("--listen", required=True, help="tcp:<ip>:<port> to listen on")
    p.add_argument("--key-file", required=True, help="the shared secret (mode 0600)")
    args = p.parse_args(argv)
    try:
        key = read_key_file(args.key_file)
    except ValueError as e:
        p.error(str(e).replace(ENV_KEY_FILE, "--key-file"))
    _wire.parse_address(args.listen)  # a bad address fails here, with its message
    logging.basicConfig(level=forge_env.log_level())
    loops.run(serve_agent(args.listen, key))


if __name__ == "__main__":
    main()
