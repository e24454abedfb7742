"""Per-process runtime state: the session, event loops, connections, and owned processes.

One ``Runtime`` exists per process (``get_runtime()``; tests may ``reset_runtime()``). The
root controller creates the session: a private directory (mode 0700) for sockets and a random
secret every peer must prove it holds. Actor processes inherit the session through their
environment, so any process of a session can call any other.

Connections are per event loop: ``await`` uses the caller's running loop; ``.get()`` in plain
synchronous code uses a background loop thread owned by this runtime.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from controller import _serialization as ser
from controller import _wire, env_vars, loops
from controller.errors import ActorDiedError

logger = logging.getLogger("controller")

ENV_DIR, ENV_KEY, ENV_SHM = env_vars.SESSION_DIR, env_vars.SESSION_KEY, env_vars.SHM_PREFIX


@dataclass
class Session:
    dir: str
    authkey: bytes
    shm_prefix: str
    is_root: bool
    home: str = ""  # the controller's home address (controller._home), where one is served

    def env_vars(self) -> dict[str, str]:
        """The session's variables every worker inherits (its socket dir, secret, shm prefix)."""
        return {ENV_DIR: self.dir, ENV_KEY: self.authkey.hex(), ENV_SHM: self.shm_prefix}


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Whether a process with ``pid`` exists (possibly another user's). With ``start`` (its
    ``/proc/<pid>/stat`` start time, recorded while it ran): only if it is still that process,
    not a later process or thread that reuses the number (Linux; ignored elsewhere)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None and os.path.exists("/proc/self/stat"):
        from controller._reaper import start_time

        return start_time(pid) == start
    return True


# A session tag: forge-<root pid>-<host id>-<8 characters of mkdtemp>.
_TAG = r"forge-(\d+)-([0-9a-f]{8})-[a-z0-9_]{8}"
# Names the sweep may judge, and nothing else: a session directory (exactly a tag, and
# holding SESSION_MARK), and in shared memory a payload (a tag, then "-"), a weight file of
# the run's prefix (forge-w-, then a tag) or any other weight file or its lock (forge-w-...,
# ending in ".<tag>").
_SESSION_DIR = re.compile(rf"^{_TAG}$")
_SESSION_SHM = re.compile(rf"^(?:forge-w-)?{_TAG}-|^forge-w-.*\.{_TAG}(?:\.lock)?$")
# The file Forge writes into every session directory it makes, holding the directory's name:
# the sweep removes a directory only with it, whatever the name (another program's
# /tmp/forge-<pid>-<8 letters> is never Forge's to remove).
SESSION_MARK = ".forge-session"


def host_id() -> str:
    """8 hex digits naming this host's running kernel (its boot id): session names carry it,
    so that a sweep on one host never judges another host's files by a pid of its own."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:8]
    except OSError:
        return "00000000"


def session_tag() -> str:
    """A string unique to this session (``forge-<root pid>-<id>``). Name session-scoped files
    under /dev/shm with it and the root controller removes them when the session ends, or the
    next session does if the root was killed."""
    return get_runtime().session.shm_prefix


def make_session_dir() -> str:
    """A new private directory (mode 0700) named ``forge-<pid>-<host id>-<8 characters>``,
    marked as Forge's own (``SESSION_MARK``) so that a later sweep may remove it."""
    d = tempfile.mkdtemp(prefix=f"forge-{os.getpid()}-{host_id()}-")
    fd = os.open(os.path.join(d, SESSION_MARK), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.path.basename(d))
    return d


def _marked(path: str, uid: int) -> bool:
    """Whether ``path`` holds Forge's mark: a regular file of ``uid`` naming the directory."""
    mark = os.path.join(path, SESSION_MARK)
    try:
        st = os.lstat(mark)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > 255:
            return False
        with open(mark) as f:
            return f.read() == os.path.basename(path)
    except (OSError, UnicodeDecodeError):
        return False


def _sweep_stale_sessions(tmp: str) -> None:
    """Remove socket dirs and shm files of root controllers of this host that died without
    cleanup. Only Forge's own names are judged (``_SESSION_DIR``, ``_SESSION_SHM``: never a
    name that merely contains ``forge-<pid>-``), only this user's files, never names of
    another host's sessions (e.g. copies a worker made here), and a directory only when it
    holds Forge's mark (``SESSION_MARK``)."""
    me, uid = host_id(), os.geteuid()
    for base, pattern in ((tmp, _SESSION_DIR), (ser.SHM_DIR, _SESSION_SHM)):
        if base is None:
            continue
        for name in os.listdir(base):
            m = pattern.match(name)
            if m is None:
                continue
            pid, host = next((g, h) for g, h in zip(m.groups()[::2], m.groups()[1::2]) if g)
            if host != me or pid_alive(int(pid)):
                continue  # another host's, or its controller lives
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if st.st_uid != uid:
                continue  # another user's: not ours to judge (root could remove it)
            if stat.S_ISDIR(st.st_mode):
                if base == tmp and _marked(path, uid):
                    shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _new_session() -> Session:
    inherited = env_vars.inherited_session()
    if inherited is not None:
        prefix = inherited.shm_prefix or ser.shm_prefix()
        ser.set_shm_prefix(prefix)
        return Session(inherited.dir, inherited.authkey, prefix, False)
    tmp = tempfile.gettempdir()
    try:
        _sweep_stale_sessions(tmp)
    except OSError as e:
        logger.debug("stale session sweep failed: %s", e)
    d = make_session_dir()
    prefix = os.path.basename(d)  # the session tag
    ser.set_shm_prefix(prefix)
    return Session(d, os.urandom(32), prefix, True)


class Client:
    """The calls from one event loop to one actor process."""

    def __init__(self, runtime: Runtime, address: str, mesh: str, rank: int, pid: int | None):
        self.runtime = runtime
        self.address = address
        self.mesh, self.rank, self.pid = mesh, rank, pid
        self.pending: dict[int, asyncio.Future] = {}
        self.proto: _wire.FrameProtocol | None = None
        self.dead: Exception | None = None
        self._connecting: asyncio.Task | None = None
        self._ids = itertools.count(1)

    async def channel(self) -> _wire.FrameProtocol:
        if self.dead is not None:
            raise self.dead
        if self.proto is not None and not self.proto.closed:
            return self.proto
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _wire.FrameProtocol:
        try:
            self.proto = await _wire.open_channel(
                self.address, self.runtime.session.authkey, self._on_frame, self._on_lost
            )
        except (ConnectionError, FileNotFoundError, OSError, asyncio.TimeoutError) as e:
            err = await self._death_error(f"cannot connect to {self.address}: {e}")
            self.dead = err
            raise err from None
        return self.proto

    def request(self, kind: int, body: bytes) -> Any:  # an asyncio.Future with a .cid
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[cid] = fut
        self.proto.send(kind, cid, body)  # pyright: ignore[reportOptionalMemberAccess]  # after channel()
        fut.cid = cid  # type: ignore[attr-defined]
        return fut

    @property
    def in_flight(self) -> int:
        """Calls sent from this loop to this process and not yet answered."""
        return len(self.pending)

    def _on_frame(self, proto, kind, cid, body):
        fut = self.pending.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_result((kind, body))

    def _on_lost(self, proto, exc):
        if self.dead is None and not self.pending:
            return
        asyncio.ensure_future(self._fail_pending())

    async def _fail_pending(self):
        err = await self._death_error("")
        self.dead = err
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    async def _death_error(self, detail: str) -> ActorDiedError:
        """Build the error for a lost process; if this process owns it, wait (up to 1 s) for
        its exit status so the error can name the exit code or signal."""
        proc = self.runtime.local_procs.get(self.address)
        returncode = None
        if proc is not None:
            try:
                returncode = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 1.0)
            except RuntimeError:  # the loop is shutting down: no executor; don't wait
                returncode = proc.wait(0)
            if not detail and getattr(proc, "lost", ""):
                detail = proc.lost  # e.g. a Monarch process whose exit status is unknown
            if proc.stopping and not detail:
                detail = "the mesh was stopped"
        return ActorDiedError(self.mesh, self.rank, self.pid, returncode, detail)

    def fail(self) -> None:
        """The process is known to be dead (its backend said so): fail the calls in flight
        and every later one now, without waiting for the connection to drop."""
        if self.dead is not None:
            return
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.abort()
        asyncio.ensure_future(self._fail_pending())

    def abort(self) -> None:
        """Close the socket of a client whose event loop is already closed."""
        if self.proto is not None and self.proto.transport is not None:
            sock = getattr(self.proto.transport, "_sock", None)
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


class Runtime:
    """Everything this process knows about the session."""

    home_server: Any  # the session home's server, once started (controller/_home.py)

    def __init__(self):
        self.session = _new_session()
        self.lock = threading.RLock()
        self._clients: dict[asyncio.AbstractEventLoop, dict[str, Client]] = {}
        self._bg_loop: asyncio.AbstractEventLoop | None = None
        self._bg_thread: threading.Thread | None = None
        self.local_procs: dict[str, Any] = {}  # address -> _local.LocalProc (or a backend's)
        self.proc_meshes: list = []  # ProcMeshes owned by this process, in spawn order
        self.services: list = []  # services created by this process
        self.status_fields: dict = {}  # app fields for status snapshots (controller/status.py)
        self._names = itertools.count()
        self.closed = False
        atexit.register(self.close)

    def unique_name(self, base: str) -> str:
        return f"{base}-{next(self._names)}"

    # -- loops -----------------------------------------------------------------------------
    def background_loop(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self._bg_loop is None:
                loop = loops.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="forge-runtime", daemon=True)
                t.start()
                self._bg_loop, self._bg_thread = loop, t
            return self._bg_loop

    def client(self, address: str, mesh: str, rank: int, pid: int | None) -> Client:
        loop = asyncio.get_running_loop()
        clients = self._clients.get(loop)
        if clients is None:
            self._forget_closed_loops()
            clients = self._clients[loop] = {}
        c = clients.get(address)
        if c is None:
            c = clients[address] = Client(self, address, mesh, rank, pid)
        return c

    def _forget_closed_loops(self) -> None:
        for loop in [lp for lp in self._clients if lp.is_closed()]:
            for c in self._clients.pop(loop).values():
                c.abort()

    def clients_for(self, address: str) -> list[Client]:
        return [cs[address] for cs in self._clients.values() if address in cs]

    def fail_calls(self, address: str) -> None:
        """The process at ``address`` died: fail its calls in flight from every loop of this
        process at once (thread-safe; a backend that learns of a death calls this)."""
        for loop, clients in list(self._clients.items()):
            client = clients.get(address)
            if client is None or loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(client.fail)
            except RuntimeError:  # the loop closed meanwhile
                pass

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process this runtime spawned (SIGTERM, then SIGKILL after 2 s) and remove
        the session's files. Runs at interpreter exit; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if getattr(self, "home_server", None) is not None and self._bg_loop is not None:
            self._bg_loop.call_soon_threadsafe(self.home_server.close)
        procs = [p for p in self.local_procs.values() if p.returncode is None]
        for p in procs:
            p.stopping = True
            _signal_quietly(p, signal.SIGTERM)
        for p in procs:
            if p.wait(2.0) is None:
                _signal_quietly(p, signal.SIGKILL)
                p.wait(1.0)
        from controller import _zygote

        _zygote.close_all()
        ser.close_pool()
        if self.session.is_root:
            shutil.rmtree(self.session.dir, ignore_errors=True)
            ser.sweep_shm(self.session.shm_prefix)
        if self._bg_loop is not None:
            self._bg_loop.call_soon_threadsafe(self._bg_loop.stop)


def _signal_quietly(p, sig: int) -> None:
    """Signal a rank at close; one already gone (its host lost, its Ray actor removed) is
    not an error: close goes on to the others."""
    try:
        p.signal(sig)
    except Exception as e:  # noqa: BLE001 - see above
        logger.debug("close: could not signal %s: %s", getattr(p, "pid", p), e)


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def reset_runtime() -> None:
    """Close the current runtime (killing its processes) and start afresh on next use."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None


def install_signal_handlers() -> None:
    """Turn SIGTERM into a normal exit (so atexit cleanup runs) if nobody else handles it,
    and make SIGINT raise KeyboardInterrupt even if it was inherited as ignored (a shell
    starts background jobs that way): a controller must stop on SIGINT, never run on."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _on_term(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _on_term)
