"""The one module that reads Forge's ``FORGE_*`` environment variables.

Every accessor reads ``os.environ`` when called, never at import time, so a test can set a
variable with ``monkeypatch.setenv`` and see the effect at once. ``forge.settings`` builds
Forge's own accessors on these (``controller`` cannot import ``forge``); other modules call
them and never read ``os.environ`` for a ``FORGE_*`` name themselves
(``tests/unit/test_env_vars.py`` checks this, and that every variable below is in
``docs/configuration.md``). Writing these names into a child process's environment dict is
fine: that is how the launch protocol works. (The module is ``env_vars``, not ``env``: in Forge
``env`` means an RL environment.)

Set by the user:

========================  =================  ===============================================
Variable                  Default            Meaning
========================  =================  ===============================================
``FORGE_BACKEND``         ``local``          Where actor processes come from: ``local``
                                             (this host), ``ray`` (a Ray cluster: the one in
                                             ``RAY_ADDRESS``, else a local Ray instance; needs
                                             ``forge[ray]``) or ``monarch`` (needs
                                             ``forge[monarch]``).
``FORGE_RAY_CPUS``        ``1``              ``ray`` backend: logical CPUs each rank reserves
                                             in its placement group bundle.
``FORGE_LOG_LEVEL``       ``WARNING`` /      Logging level name of actor processes and host
                          ``INFO``           agents (``WARNING``); ``forge.settings.get_log_level``
                                             defaults to ``INFO``.
``FORGE_RUN_DIR``         ``runs``           Parent folder of run directories (``forge run``,
                                             ``forge top``).
``FORGE_CACHE_DIR``       ``~/.cache/forge`` Where tiny models and other derived artefacts are
                                             built and kept.
``FORGE_SHM_POOL_BYTES``  ``1073741824``     Most bytes of warm shared-memory message segments
                                             a process keeps for reuse.
``FORGE_THREAD_BUDGET``   ``1``              ``0``/``false``/``off`` turns the per-host
                                             compute-thread budget off (``controller.threads``).
``FORGE_HOST_CORES``      unset              Cores the thread budget shares (default: this
                                             process's CPU affinity, capped by a cgroup quota).
``FORGE_UVLOOP``          ``1``              ``0`` runs every process on asyncio's own event
                                             loop instead of uvloop.
``FORGE_TASK_DUMP``       ``1``              ``0`` leaves SIGUSR1 alone (else it prints the
                                             process's asyncio tasks: ``task_dump``).
``FORGE_DETERMINISTIC``   unset              ``1`` (set by a run with ``deterministic: true``):
                                             torch's deterministic kernels in actor processes.
``FORGE_VISIBLE_GPUS``    unset              GPUs the provisioner hands out (comma-separated;
                                             wins over ``CUDA_VISIBLE_DEVICES``).
``FORGE_API_KEY``         unset              ``forge serve``: the key clients must send when
                                             ``--api-key`` is not given.
``FORGE_HANDSHAKE_TIMEOUT_S``                 Seconds (default ``10``) a peer of a Forge
                                             listener has to complete the HMAC handshake
                                             before it is dropped.
``FORGE_MAX_PENDING_CONNECTIONS``            Peers (default ``64``) a Forge listener lets
                                             authenticate at once; newer ones are closed.
``FORGE_CALL_TIMEOUT_S``  ``600``            Default bound, in seconds, of remote calls that
                                             would otherwise wait without one: every call to
                                             the controller's home (files, service tables)
                                             and ``forge serve``'s calls to its trainers;
                                             ``0``: no bound.
``FORGE_ZYGOTE``          ``1``              ``0``: the local backend starts every actor
                                             process fresh instead of forking those of meshes
                                             that name ``FORGE_PRELOAD`` from a zygote.
``FORGE_PREFORK``         ``1``              ``forge run`` forks the actors' zygote from
                                             itself (``controller._prefork``) instead of a
                                             fresh zygote importing torch and transformers
                                             again; ``0``: always a fresh zygote.
``FORGE_CPU_BF16``        unset              ``1``/``0``: this process's CPU counts as having
                                             (or lacking) native bf16 when an ``auto``
                                             precision is resolved
                                             (``forge.models.precision``); unset: read from
                                             ``/proc/cpuinfo``.
``FORGE_MALLOC``          ``1``              Actor processes start with glibc malloc settings
                                             that keep freed memory for reuse instead of
                                             page faults (``controller.malloc``); ``0``:
                                             glibc's defaults (memory given back between
                                             steps).
========================  =================  ===============================================

Set by the process that spawns an actor process (the launch protocol; never set by hand):

========================  ==================================================================
Variable                  Meaning (who sets it)
========================  ==================================================================
``FORGE_MESH``            The process mesh's name (``controller._launch.worker_env_vars``, for
                          every backend).
``FORGE_RANK``            This process's linear rank in its mesh (same).
``FORGE_SIZE``            The mesh's number of processes (same).
``FORGE_SHAPE``           The mesh's sizes by dimension, as JSON (same).
``FORGE_ADDRESS``         Address the worker serves on, ``unix:<path>`` or ``tcp:<ip>:<port>``
                          (port 0: the worker reports the one it got) (same).
``FORGE_READY_FD``        Pipe the worker writes ``<pid> <address>`` to once it serves
                          (``controller._local``).
``FORGE_LIFELINE_FD``     Pipe whose end-of-file tells the worker its parent died
                          (``controller._local``).
``FORGE_SYS_PATH``        The parent's ``sys.path``, as JSON (``controller._local``).
``FORGE_PRELOAD``         Modules every process of a mesh imports, comma-separated: set,
                          its processes fork from a zygote that has imported them
                          (``controller._zygote``; ``forge.run.actor_env_vars`` sets it).
``FORGE_SESSION_DIR``     The session's private socket directory (``controller._runtime``).
``FORGE_HOME``            Address of the controller's home, where workers on other hosts read
                          service tables and files of the controller's host
                          (``controller._home``; ``ray`` backend).
``FORGE_SESSION_KEY``     The session's secret, hex (``controller._runtime``), in the
                          environment a launcher hands ``controller._local``; that one takes it
                          out and passes it on over a socket instead.
``FORGE_SESSION_KEY_FD``  Socket the worker receives the session's secret (hex) on at
                          start-up, once it has said it is non-dumpable, then closes
                          (``controller._local``): the secret is never in an actor process's
                          environment, where ``/proc/<pid>/environ`` would show it, nor where
                          another process could take it while the worker starts.
``FORGE_SHM_PREFIX``      Name prefix of the session's shared-memory files
                          (``controller._runtime``).
========================  ==================================================================

``get(name)`` reads any other variable, for ``${env:VAR}`` in config files.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BACKENDS",
    "NOT_DUMPABLE",
    "SESSION_DIR",
    "SESSION_KEY",
    "SESSION_KEY_FD",
    "SHM_PREFIX",
    "InheritedSession",
    "WorkerPlace",
    "backend",
    "cache_dir",
    "get",
    "host_cores",
    "inherited_session",
    "lifeline_fd",
    "log_level",
    "malloc_tuning",
    "prefork",
    "ready_fd",
    "run_dir",
    "shm_pool_bytes",
    "take_session_key",
    "sys_path",
    "thread_budget",
    "uvloop",
    "visible_gpus",
    "worker_place",
    "zygote",
]

BACKENDS = ("local", "ray", "monarch")
# Launch-protocol names that spawners also write into a child's environment.
SESSION_DIR = "FORGE_SESSION_DIR"
SESSION_KEY = "FORGE_SESSION_KEY"
SESSION_KEY_FD = "FORGE_SESSION_KEY_FD"
NOT_DUMPABLE = b"N"  # a worker's word on FORGE_SESSION_KEY_FD: it is non-dumpable; send the key
SHM_PREFIX = "FORGE_SHM_PREFIX"
HOME = "FORGE_HOME"
PRELOAD = "FORGE_PRELOAD"  # modules a mesh's processes need: they fork from a zygote (_zygote)


def get(name: str) -> str | None:
    """The raw value of ``name`` (any variable), ``None`` when unset."""
    return os.environ.get(name)


# -- set by the user -------------------------------------------------------------------------
def api_key() -> str:
    """``FORGE_API_KEY``: ``forge serve``'s key when ``--api-key`` is not given ("" if unset)."""
    return os.environ.get("FORGE_API_KEY", "")


def backend() -> str:
    """``FORGE_BACKEND``: ``local`` (default), ``ray`` or ``monarch``."""
    name = os.environ.get("FORGE_BACKEND", "local").strip().lower() or "local"
    if name == "hosts":
        raise ValueError(
            "FORGE_BACKEND=hosts (Forge's own host agents) was removed: start a Ray cluster "
            "(`ray start --head` / `ray start --address=...`) and use FORGE_BACKEND=ray with "
            "RAY_ADDRESS; see docs/multihost.md"
        )
    if name not in BACKENDS:
        raise ValueError(f"unknown FORGE_BACKEND {name!r}; choose one of {list(BACKENDS)}")
    return name


def ray_cpus() -> float:
    """``FORGE_RAY_CPUS``: logical CPUs a rank reserves on the ``ray`` backend (default 1)."""
    raw = os.environ.get("FORGE_RAY_CPUS", "1")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"FORGE_RAY_CPUS must be a positive number of CPUs, got {raw!r}")
    return value


def ray_address() -> str | None:
    """``RAY_ADDRESS`` (Ray's own variable): the cluster the ``ray`` backend joins; ``None``
    starts a Ray instance on this host."""
    return os.environ.get("RAY_ADDRESS") or None


def log_level(default: str = "WARNING") -> str:
    """``FORGE_LOG_LEVEL`` upper-cased (``default`` when unset or empty); ``ValueError`` for a
    name that is not a logging level."""
    import logging

    value = os.environ.get("FORGE_LOG_LEVEL", "").strip().upper() or default
    # getLevelName maps a known name to its int and an unknown one to the string "Level X".
    if not isinstance(logging.getLevelName(value), int):
        raise ValueError(
            f"FORGE_LOG_LEVEL={value!r} is not a logging level; "
            "choose one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
        )
    return value


def run_dir() -> Path:
    """``FORGE_RUN_DIR`` (default ``runs``), user-expanded."""
    return Path(os.environ.get("FORGE_RUN_DIR") or "runs").expanduser()


def cache_dir() -> Path:
    """``FORGE_CACHE_DIR`` (default ``~/.cache/forge``), user-expanded."""
    return Path(os.environ.get("FORGE_CACHE_DIR") or "~/.cache/forge").expanduser()


def shm_pool_bytes() -> int:
    """``FORGE_SHM_POOL_BYTES`` (default 1 GiB)."""
    return int(os.environ.get("FORGE_SHM_POOL_BYTES") or 1 << 30)


def thread_budget() -> bool:
    """Whether the compute-thread budget is on: ``FORGE_THREAD_BUDGET`` not ``0``/``false``/
    ``off`` (default on)."""
    return os.environ.get("FORGE_THREAD_BUDGET", "1").strip() not in ("0", "false", "off")


def host_cores() -> int | None:
    """``FORGE_HOST_CORES`` (at least 1), ``None`` when unset or empty."""
    forced = os.environ.get("FORGE_HOST_CORES")
    return max(1, int(forced)) if forced else None


def uvloop() -> bool:
    """Whether uvloop may be used: ``FORGE_UVLOOP`` is not ``0`` (default on)."""
    return os.environ.get("FORGE_UVLOOP", "1") != "0"


def zygote() -> bool:
    """Whether the local backend forks actor processes from a zygote that has imported torch
    and transformers (``controller._zygote``): ``FORGE_ZYGOTE`` is not ``0`` (default on)."""
    return os.environ.get("FORGE_ZYGOTE", "1") != "0"


def prefork() -> bool:
    """Whether ``forge run`` may fork the actors' zygote from itself (``controller._prefork``):
    ``FORGE_PREFORK`` and ``FORGE_ZYGOTE`` not ``0`` (default on)."""
    return zygote() and os.environ.get("FORGE_PREFORK", "1") != "0"


def malloc_tuning(env: dict[str, str] | None = None) -> bool:
    """Whether actor processes get ``controller.malloc``'s settings: ``FORGE_MALLOC`` (in
    ``env``, a child's environment, else this process's) is not ``0`` (default on)."""
    return (os.environ if env is None else env).get("FORGE_MALLOC", "1").strip() != "0"


def task_dump() -> bool:
    """Whether ``kill -USR1`` prints a process's asyncio tasks (``controller.task_dump``):
    ``FORGE_TASK_DUMP`` is not ``0`` (default on)."""
    return os.environ.get("FORGE_TASK_DUMP", "1") != "0"


def deterministic() -> bool:
    """Whether this process runs torch's deterministic kernels: ``FORGE_DETERMINISTIC=1``."""
    return os.environ.get("FORGE_DETERMINISTIC", "") == "1"


def cpu_bf16() -> bool | None:
    """``FORGE_CPU_BF16``: ``True`` for ``1``, ``False`` for ``0``, ``None`` when unset (the
    CPU's flags decide); anything else is a ``ValueError``."""
    raw = os.environ.get("FORGE_CPU_BF16", "").strip()
    if not raw:
        return None
    if raw not in ("0", "1"):
        raise ValueError(f"FORGE_CPU_BF16 must be 0 or 1 (or unset), got {raw!r}")
    return raw == "1"


def _positive(name: str, default: str, kind=float) -> Any:  # a `kind` > 0
    raw = os.environ.get(name, "").strip() or default
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if not value > 0:
        raise ValueError(f"{name} must be a positive number, got {raw!r}")
    return value


def handshake_timeout_s() -> float:
    """``FORGE_HANDSHAKE_TIMEOUT_S`` (default 10): seconds a peer of a Forge listener has to
    authenticate before it is dropped."""
    return _positive("FORGE_HANDSHAKE_TIMEOUT_S", "10")


def max_pending_connections() -> int:
    """``FORGE_MAX_PENDING_CONNECTIONS`` (default 64): peers a Forge listener lets
    authenticate at once."""
    return _positive("FORGE_MAX_PENDING_CONNECTIONS", "64", int)


def call_timeout_s() -> float | None:
    """``FORGE_CALL_TIMEOUT_S`` (default 600): the default bound of remote calls that would
    otherwise wait without one (every call to the home; ``forge serve``'s trainers and other
    meshes given it with ``with_default_timeout``); ``None`` when set to ``0``."""
    raw = os.environ.get("FORGE_CALL_TIMEOUT_S", "").strip() or "600"
    if raw == "0":
        return None
    return _positive("FORGE_CALL_TIMEOUT_S", raw)


def visible_gpus() -> str | None:
    """``FORGE_VISIBLE_GPUS``, raw (comma-separated), ``None`` when unset."""
    return os.environ.get("FORGE_VISIBLE_GPUS")


# -- set by the spawner (the launch protocol) ------------------------------------------------
@dataclass(frozen=True)
class WorkerPlace:
    """Where an actor process sits: its mesh, rank, the mesh's size and shape, its address."""

    mesh: str
    rank: int
    size: int
    shape: dict[str, int]
    address: str


def worker_place() -> WorkerPlace:
    """``FORGE_MESH``, ``FORGE_RANK``, ``FORGE_SIZE``, ``FORGE_SHAPE`` and ``FORGE_ADDRESS``
    of an actor process (``KeyError`` outside one)."""
    e = os.environ
    return WorkerPlace(
        mesh=e["FORGE_MESH"],
        rank=int(e["FORGE_RANK"]),
        size=int(e["FORGE_SIZE"]),
        shape=json.loads(e["FORGE_SHAPE"]),
        address=e["FORGE_ADDRESS"],
    )


def home_address() -> str:
    """``FORGE_HOME``: the controller's home (``controller._home``); ``""`` when unset."""
    return os.environ.get(HOME, "")


def ready_fd() -> int:
    """``FORGE_READY_FD``: the pipe an actor process reports ``<pid> <address>`` on."""
    return int(os.environ["FORGE_READY_FD"])


def lifeline_fd() -> int:
    """``FORGE_LIFELINE_FD``: the pipe whose end-of-file means the parent died."""
    return int(os.environ["FORGE_LIFELINE_FD"])


def sys_path() -> list[str]:
    """``FORGE_SYS_PATH``: the parent's ``sys.path`` (``[]`` when unset)."""
    return json.loads(os.environ.get("FORGE_SYS_PATH", "[]"))


@dataclass(frozen=True)
class InheritedSession:
    """A session passed down by the root controller: socket dir, secret, shm name prefix."""

    dir: str
    authkey: bytes
    shm_prefix: str | None


_taken_key: list[str] = []  # the secret take_session_key() read (at most one)


def take_session_key() -> None:
    """In an actor process, at start-up, once it is non-dumpable (``controller._worker``):
    receive the session's secret on the socket in ``FORGE_SESSION_KEY_FD`` (saying
    ``NOT_DUMPABLE`` first: the parent sends nothing before) or read ``FORGE_SESSION_KEY``,
    keep it in this process's memory only, and remove both variables from ``os.environ``, so
    that no process this one starts inherits the secret. ``inherited_session`` returns it from
    then on."""
    fd = os.environ.pop(SESSION_KEY_FD, None)
    key = os.environ.pop(SESSION_KEY, None)
    if fd is not None:
        chunks = []
        with socket.socket(fileno=int(fd)) as sock:
            sock.sendall(NOT_DUMPABLE)
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        key = b"".join(chunks).decode().strip()
    if key:
        _taken_key[:] = [key]


def inherited_session() -> InheritedSession | None:
    """The session in ``FORGE_SESSION_DIR``/``FORGE_SESSION_KEY``/``FORGE_SHM_PREFIX`` (the
    secret as ``take_session_key`` kept it, in an actor process), or ``None`` in a root
    controller (no directory or key set)."""
    d = os.environ.get(SESSION_DIR)
    key = os.environ.get(SESSION_KEY) or (_taken_key[0] if _taken_key else None)
    if not (d and key):
        return None
    return InheritedSession(d, bytes.fromhex(key), os.environ.get(SHM_PREFIX))
