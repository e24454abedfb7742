"""The actors' zygote forked from the controller itself (``prefork``), for ``forge run``.

A zygote (``controller._zygote``) is a fresh interpreter that imports torch and transformers
before it forks actor processes: seconds of CPU while the first actors wait
(docs/benchmarks.md, "Actor process start-up"). A ``forge run`` controller has imported them already (its app's config and loop
need them) by the time it is about to spawn. ``prefork(env_vars)`` forks the zygote from the
controller at that point, so the run pays the imports once instead of twice and its first
actors do not wait for a second interpreter.

A fork copies the controller as it is, so ``prefork`` forks only when that copy is the
process a fresh zygote would have been, and otherwise leaves the meshes to a fresh zygote:

- no other Python thread runs (a fork copies the calling thread alone: a lock another
  thread holds would stay held in the copy);
- the environment the mesh's processes get (``controller._local.worker_env``) differs from
  this process's only in names whose start-up effect can be applied in each child after the
  fork (``APPLIED``: torch's thread count, unbuffered output, ``PYTHONPATH`` (the worker sets
  ``sys.path`` itself), transformers' verbosity, huggingface_hub's progress bars). Any other
  difference (``PYTHONHASHSEED``, ``CUDA_VISIBLE_DEVICES``, ...) means a fresh zygote. So does
  a controller started without the actors' malloc settings (``controller.malloc``: glibc reads
  ``GLIBC_TUNABLES`` only at a process's start); ``forge run`` and ``forge eval`` start
  themselves again with them for this;
- the session's secret is not in this process's start-up environment (a forked child's
  ``/proc/<pid>/environ`` shows its parent's);
- the host has no GPU device (the CUDA driver cannot be used in a child forked after it
  started, and merely asking ``torch.cuda.is_available()`` starts it), and the local backend
  is in use (Ray and Monarch start their workers themselves).

The copy makes itself non-dumpable (``_zygote.not_dumpable``) at once, closes every inherited
descriptor but stdio and its socket (the controller's end among them: it must see the
controller go), resets signal handlers to an interpreter's defaults, takes a session and a
process title of its own, and then serves as a fresh zygote does (``_zygote.serve``),
registered for exactly that environment.

On by default (``FORGE_PREFORK=0``: off). It was opt-in for a few hours: the guess demo's
learning gain fell below its test's bound in 2 of 4 runs with it on. In 11 runs on and off
(+0.013 to +0.082 on, -0.009 to +0.077 off) it made no difference: the check was fragile
either way (docs/performance.md).
"""

from __future__ import annotations

import importlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

from controller import _zygote

APPLIED = (
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "PYTHONPATH",
    "TRANSFORMERS_VERBOSITY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
)
_TRUE = ("1", "true", "yes", "on")
_LEVELS = ("detail", "debug", "info", "warning", "error", "critical")  # transformers' names


def prefork(env_vars: dict[str, str]) -> bool:
    """Fork the zygote of meshes with ``env_vars`` from this process, if it qualifies (module
    docstring); returns whether it did. Imports the preload modules this process lacks."""
    from controller import env_vars as names
    from controller._local import worker_env

    preload = env_vars.get(names.PRELOAD, "")
    if not preload or not names.prefork() or _secret_at_start(names.SESSION_KEY):
        return False
    if names.backend() != "local":  # Ray and Monarch start their workers themselves
        return False
    if _has_gpu_devices():
        return False
    env = worker_env(env_vars)
    applied = _applied(_zygote.zygote_env(env), _zygote.zygote_env(dict(os.environ)))
    if applied is None:
        return False
    for name in filter(None, (n.strip() for n in preload.split(","))):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - as a fresh zygote: a child imports it itself
            pass
    if threading.active_count() > 1:
        return False
    key = _zygote.zygote_key(env)
    if key in _zygote._zygotes:
        return False
    try:
        z = ForkedZygote(applied)  # no lock held: the copy would inherit it held
    except OSError:
        return False
    with _zygote._zlock:
        if _zygote._zygotes.setdefault(key, z) is z:
            return True
    z.close()
    return False


def _applied(child: dict[str, str], mine: dict[str, str]) -> dict[str, str] | None:
    """The names (and the child's values) a child must apply after the fork, or ``None`` if
    some difference cannot be applied."""
    out = {}
    for name in child.keys() | mine.keys():
        value = child.get(name)
        if value == mine.get(name):
            continue
        if name not in APPLIED or not _can_apply(name, value):
            return None
        out[name] = value
    return out


def _can_apply(name: str, value: str | None) -> bool:
    if name == "PYTHONPATH":
        return True
    if value is None:
        return False
    if name == "OMP_NUM_THREADS":
        return value.isdigit() and int(value) > 0
    if name == "TRANSFORMERS_VERBOSITY":
        return value in _LEVELS
    if name == "HF_HUB_DISABLE_PROGRESS_BARS":
        return value.lower() in _TRUE
    return bool(value)  # PYTHONUNBUFFERED: any non-empty value


def _has_gpu_devices() -> bool:
    """Whether this host has NVIDIA or AMD GPU device files. The CUDA driver is not usable in
    a child forked after it started, and ``torch.cuda.is_available()`` alone starts it; a
    fresh zygote cannot have that problem, so a GPU host keeps it (its runs are long enough
    that a second import does not matter)."""
    dev = "/dev"
    try:
        names = os.listdir(dev)
    except OSError:
        return True
    return "kfd" in names or any(n.startswith("nvidia") for n in names)


def _secret_at_start(name: str) -> bool:
    try:
        with open("/proc/self/environ", "rb") as f:
            return any(v.startswith(name.encode() + b"=") for v in f.read().split(b"\0"))
    except OSError:
        return True  # cannot tell: do not fork


def _apply(applied: dict[str, str]) -> None:
    """In a child, once its environment is in place: what these names do at start-up."""
    if "OMP_NUM_THREADS" in applied and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(applied["OMP_NUM_THREADS"]))
    if "PYTHONUNBUFFERED" in applied:  # what ``python -u`` makes of stdout and stderr
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            new = io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding=old.encoding,
                errors=old.errors,
                write_through=True,
            )
            setattr(sys, name, new)
            setattr(sys, f"__{name}__", new)
    if "TRANSFORMERS_VERBOSITY" in applied and "transformers" in sys.modules:
        from transformers.utils import logging as tf_logging

        tf_logging.set_verbosity(tf_logging.log_levels[applied["TRANSFORMERS_VERBOSITY"]])
    if "HF_HUB_DISABLE_PROGRESS_BARS" in applied and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


class ForkedZygote(_zygote.Zygote):
    """A ``Zygote`` whose process is a fork of this one (``prefork``)."""

    def __init__(self, applied: dict[str, str]):
        self._applied = applied
        super().__init__({}, "")

    def _start(self, there, env, preload):
        sys.stdout.flush()  # else the copy would write this process's pending output again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_zygote(there.fileno(), self._applied)
        return _Forked(pid)


def _become_zygote(sock_fd: int, applied: dict[str, str]) -> None:
    """In the forked copy: shed the controller, then serve; never returns."""
    try:
        _zygote.not_dumpable()  # first: it holds a copy of the controller's memory
        os.setsid()
        os.closerange(3, sock_fd)
        os.closerange(sock_fd + 1, os.sysconf("SC_OPEN_MAX"))
        for sig in signal.valid_signals():
            try:
                if callable(signal.getsignal(sig)):
                    signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _zygote._title_setup()
        try:
            from setproctitle import setproctitle

            setproctitle(f"forge-zygote (forked from pid {os.getppid()}; controller._prefork)")
        except ImportError:
            pass
        import socket

        _zygote.serve(socket.socket(fileno=sock_fd), after_fork=lambda env: _apply(applied))
    except BaseException:  # noqa: BLE001 - reported, and never back into the controller's code
        traceback.print_exc()
    finally:
        os._exit(1)


class _Forked:
    """What ``Zygote.close`` uses of a ``Popen``, for the forked zygote."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 1  # reaped elsewhere: its status is unknown
                break
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                break
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("forge-zygote", timeout or 0.0)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
