"""A run's live status as a small JSON file: meshes, services and replicas, plus app fields.

``status_snapshot()`` describes what this process's runtime knows right now (no calls to
any actor: only state the controller already holds). ``StatusWriter(path).start()`` writes
that snapshot to ``path`` about once a second from a daemon thread, each time to a temporary
file then ``os.replace`` (a reader never sees half a file); ``finish("finished" | "crashed" |
"interrupted", error=...)`` writes the last one and stops. Apps add their own fields with
``set_status_field(key, value)`` (JSON-able values); they appear under ``"extra"``.
``forge top`` (forge/cli/top.py) renders the file, so it works without a port and after the run.

Snapshot format (``"format": 1``)::

    {"format": 1, "state": "running", "error": null, "traceback": null,
     "pid": 123, "pid_start": "...", "host": "...", "started_at": t, "updated_at": t,
     "interval_s": 1.0,
     "info": {...given to StatusWriter...},
     "meshes": [{"name", "sizes", "ranks": [{"rank", "pid", "host", "alive", "exit"}]}],
     "services": [{"name", "actor", "max_concurrent",
                   "requests": {"sent", "retried", "completed", "failed", "cancelled"},
                   "replicas": [{"index", "state", "pids", "hosts",
                   "in_flight", "queued", "restarts", "last_error", "requests_total",
                   "requests_failed", "latency_p50_ms", "latency_p99_ms"}]}],
     "extra": {...set_status_field...}}
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from controller._reaper import start_time
from controller._runtime import get_runtime
from controller.errors import describe_exit

logger = logging.getLogger("controller")

FORMAT = 1
STATES = ("running", "finished", "crashed", "interrupted")
_TRACEBACK_CHARS = 6000


def set_status_field(key: str, value: Any) -> None:
    """Publish ``value`` (JSON-able) under ``extra[key]`` of every later status snapshot."""
    get_runtime().status_fields[key] = value


def status_fields() -> dict[str, Any]:
    """The fields published with ``set_status_field`` so far (a copy)."""
    return dict(get_runtime().status_fields)


def host_of(address: str) -> str | None:
    """The host part of a worker address (``tcp:<ip>:<port>``); ``None`` for a unix socket,
    which is on the controller's host."""
    if not address.startswith("tcp:"):
        return None
    return address[4:].rsplit(":", 1)[0]


def _mesh_entry(pm) -> dict[str, Any]:
    ranks, pids = [], pm.pids
    for rank, proc in enumerate(pm._procs):
        code = getattr(proc, "returncode", None)
        ranks.append(
            {
                "rank": rank,
                "pid": pids[rank],
                "host": host_of(pm._infos[rank].address),
                "alive": code is None,
                "exit": None if code is None else describe_exit(code),
            }
        )
    return {"name": pm.name, "sizes": pm.sizes, "ranks": ranks}


def _replica_entry(r, cap: int) -> dict[str, Any]:
    with r.lock:  # the request path appends latencies under this lock
        m = r.metrics()
    in_flight = m["in_flight"]
    return {
        "index": r.index,
        "state": m["state"],
        "pids": m["pids"],
        "hosts": [host_of(i.address) for i in r.mesh._infos] if r.mesh is not None else [],
        # in_flight counts requests waiting for one of the replica's `cap` slots too
        "in_flight": min(in_flight, cap),
        "queued": max(0, in_flight - cap),
        "restarts": m["restarts"],
        "last_error": m["last_error"],
        "requests_total": m["requests_total"],
        "requests_failed": m["requests_failed"],
        "latency_p50_ms": m["latency_p50_ms"],
        "latency_p99_ms": m["latency_p99_ms"],
    }


def status_snapshot(runtime=None) -> dict[str, Any]:
    """Meshes, services and app fields of this process's runtime (or ``runtime``), as
    JSON-able data.

    Only reads what the controller holds (no actor calls), so it is cheap enough to take
    every second from any thread. Meshes that are a service's replicas appear under their
    service."""
    rt = runtime or get_runtime()
    services, replica_meshes = [], set()
    for svc in list(rt.services):
        cap = svc.config.replica_max_concurrent_requests
        replicas = list(svc.replicas)
        for r in replicas:
            if r.mesh is not None:
                replica_meshes.add(id(r.mesh._proc_mesh))
        services.append(
            {
                "name": svc.name,
                "actor": svc._cls.__name__,
                "max_concurrent": cap,
                "requests": svc.request_counts(),  # route requests through the controller
                "replicas": [_replica_entry(r, cap) for r in replicas],
            }
        )
    meshes = [_mesh_entry(pm) for pm in list(rt.proc_meshes) if id(pm) not in replica_meshes]
    return {
        "format": FORMAT,
        "pid": os.getpid(),
        "pid_start": start_time(os.getpid()),  # tells this process from a later one
        "host": socket.gethostname(),
        "updated_at": time.time(),
        "meshes": meshes,
        "services": services,
        "extra": dict(rt.status_fields),
    }


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def format_error(exc: BaseException) -> tuple[str, str]:
    """``("Type: message", traceback text)`` for a snapshot; the traceback is cut to its
    last few thousand characters (a remote error's text carries the remote traceback)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}".rstrip(": "), text[-_TRACEBACK_CHARS:]


class StatusWriter:
    """Writes ``status_snapshot()`` to ``path`` every ``interval_s`` seconds (a daemon
    thread) until ``finish``. ``info`` (JSON-able) is copied into every snapshot."""

    def __init__(self, path: str | Path, interval_s: float = 1.0, info: dict | None = None):
        if not isinstance(interval_s, (int, float)) or interval_s <= 0:
            raise ValueError(f"StatusWriter interval_s must be a number > 0, got {interval_s!r}")
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.info = dict(info or {})
        self.started_at = time.time()
        self.writes = 0
        self._runtime = get_runtime()  # not get_runtime() per write: a reset must not revive it
        self._state, self._error, self._traceback = "running", None, None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> StatusWriter:
        """Write the first snapshot now, then keep writing in the background."""
        if not self.path.parent.is_dir():
            raise ValueError(f"status file {self.path}: directory {self.path.parent} is missing")
        self.write()
        self._thread = threading.Thread(target=self._loop, name="forge-status", daemon=True)
        self._thread.start()
        return self

    def snapshot(self) -> dict[str, Any]:
        """What the next write would contain."""
        snap = status_snapshot(self._runtime)
        snap.update(
            state=self._state,
            error=self._error,
            traceback=self._traceback,
            started_at=self.started_at,
            interval_s=self.interval_s,
            info=self.info,
        )
        return snap

    def write(self) -> None:
        """Write one snapshot now (atomic replace)."""
        with self._lock:
            write_json_atomic(self.path, self.snapshot())
            self.writes += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.write()
            except Exception as e:  # noqa: BLE001 - a full disk must not kill the run
                logger.warning("writing %s failed: %s", self.path, e)

    def finish(self, state: str = "finished", error: BaseException | str | None = None) -> None:
        """Stop the background writes and write the final snapshot, marked ``state``
        (``finished``, ``crashed`` or ``interrupted``) with ``error`` if given."""
        if state not in STATES[1:]:
            raise ValueError(f"finish state must be one of {STATES[1:]}, got {state!r}")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if isinstance(error, BaseException):
            self._error, self._traceback = format_error(error)
        elif error is not None:
            self._error = str(error)
        self._state = state
        self.write()
