"""The controller's home: one actor served from the controller process itself.

Workers on hosts that share nothing with the controller still need what lives on its host: the
replica tables of services (files in the session directory) and files (a model the controller
built in its cache, the run directory that checkpoints go into). Backends whose workers may run
on other hosts (``ray``) start the home with ``start_home(ip)``: a Forge worker loop on the
controller's background loop, listening on ``tcp:<ip>:<port>`` with the session's key (peers
authenticate before anything is unpickled, as on every Forge channel), hosting one ``Home``
actor. Its address reaches the ranks that backend starts as ``FORGE_HOME`` (and what they
start in turn); ``home()`` returns a handle to it in the controller and in those processes
(``None`` elsewhere: one host).

Paths are the controller host's absolute paths; any process of the session may read and write
files there, as it may already run code in every process of the session.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading

from controller import env_vars
from controller._actor_mesh import ActorMesh, ProcInfo
from controller._runtime import get_runtime
from controller.endpoint import endpoint
from controller.shape import Shape

HOME_ACTOR = "forge-home"
START_TIMEOUT_S = 30.0


_values: dict[str, object] = {}  # remember/recall: small values kept in the controller
_trees: collections.OrderedDict[str, list[str]] = collections.OrderedDict()  # relay_join
_trees_lock = threading.Lock()
TREES_KEPT = 64  # files relayed lately whose trees are kept


class Home:
    """The controller host's files, served to the session's workers (see module doc). Never
    spawned: ``start_home`` hosts the one instance in the controller's process."""

    @endpoint
    def put(self, key: str, value) -> None:
        """Keep ``value`` under ``key`` (e.g. the handle of the latest pushed weights)."""
        _values[key] = value

    @endpoint
    def get(self, key: str):
        """The value kept under ``key`` (``None`` if none)."""
        return _values.get(key)

    @endpoint
    def relay_join(self, key: str, source: str, address: str, fanout: int) -> str:
        """Where the host at ``address`` should copy the file relayed under ``key`` from: hosts
        join a tree rooted at ``source`` (the process that has the file) in the order they
        ask, each given the member ``fanout`` places up (with ``fanout`` 1, a chain: each
        host copies from the one that asked before it). ``controller.files.fetch_relayed``."""
        with _trees_lock:
            members = _trees.get(key)
            if members is None:
                members = _trees[key] = [source]
                while len(_trees) > TREES_KEPT:
                    _trees.popitem(last=False)
            if address not in members:
                members.append(address)
            return members[(members.index(address) - 1) // max(1, fanout)]

    @endpoint
    def tree(self, path: str) -> list[tuple[str, int]] | None:
        """``[(relative path, size)]`` of the regular files under ``path`` (``[("", size)]``
        for a file); ``None`` if nothing is there."""
        if os.path.isfile(path):
            return [("", os.path.getsize(path))]
        if not os.path.isdir(path):
            return None
        out = []
        for root, _, files in os.walk(path):
            for name in files:
                full = os.path.join(root, name)
                if os.path.isfile(full):
                    out.append((os.path.relpath(full, path), os.path.getsize(full)))
        return sorted(out)

    @endpoint
    def small(self, path: str) -> bytes | None:
        """The whole of a small file (a service's replica table), ``None`` if it is missing."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    @endpoint
    def read(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes of ``path`` from ``offset`` (fewer at its end)."""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    @endpoint
    def write(self, path: str, offset: int, data: bytes) -> None:
        """Write ``data`` into ``path`` at ``offset`` (made, with its folders, if missing)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    @endpoint
    def replace(self, src: str, dst: str) -> None:
        """``os.replace(src, dst)``: publish what ``write`` assembled, atomically."""
        os.replace(src, dst)


def start_home(ip: str) -> str:
    """Serve the home on ``tcp:<ip>:<port>`` from this (root) process; idempotent. Returns its
    address (the launcher hands it to its ranks as ``FORGE_HOME``)."""
    rt = get_runtime()
    if rt.session.home:
        return rt.session.home
    fut = asyncio.run_coroutine_threadsafe(_serve(ip), rt.background_loop())
    try:
        address = fut.result(START_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(
            f"the controller's home did not listen on {ip} within {START_TIMEOUT_S:.0f} s"
        ) from None
    rt.session.home = address
    return address


async def _serve(ip: str) -> str:
    from controller._worker import Worker  # the worker loop, hosted in this process

    rt = get_runtime()
    worker = Worker("home", 0, 1, f"tcp:{ip}:0")
    server = await _wire_serve(worker, ip, rt.session.authkey)
    port = server.sockets[0].getsockname()[1]
    worker.address = f"tcp:{ip}:{port}"
    worker.actors[HOME_ACTOR] = Home()
    worker.executors[HOME_ACTOR] = concurrent.futures.ThreadPoolExecutor(
        2, thread_name_prefix="forge-home"
    )
    rt.home_server = server  # keep it (and its worker) alive with the runtime
    return worker.address


async def _wire_serve(worker, ip: str, key: bytes):
    from controller import _wire

    return await _wire.serve(f"tcp:{ip}:0", key, worker.on_frame, None)


def home() -> ActorMesh | None:
    """A handle to the session's home, or ``None`` where there is none (one host)."""
    address = get_runtime().session.home or env_vars.home_address()
    if not address:
        return None
    mesh = ActorMesh(
        HOME_ACTOR, "Home", Home, [ProcInfo(address, 0)], Shape.full({"procs": 1}), "home"
    )
    # Every call to the home is bounded (FORGE_CALL_TIMEOUT_S): a controller host that stops
    # answering fails the caller with a CallTimeoutError naming the call, never a hang.
    return mesh.with_default_timeout(env_vars.call_timeout_s())


async def recall(key: str):
    """The value the session keeps under ``key`` at the controller (``None``: none, or no
    home in this session)."""
    if get_runtime().session.home:
        return _values.get(key)
    h = home()
    return None if h is None else await h.get.call_one(key, timeout=10.0)


def remember_sync(key: str, value) -> None:
    """Keep ``value`` under ``key`` at the controller (from code that is not async; a no-op
    in a session without a home)."""
    if get_runtime().session.home:
        _values[key] = value
        return
    h = home()
    if h is not None:
        h.put.call_one(key, value, timeout=10.0).get()
