"""A zygote: one process that imports torch and transformers once, then forks actor processes
that start with them already imported.

A fresh actor process spends seconds of CPU importing torch and transformers before it runs
a line of Forge (docs/performance.md, "Actor process start-up"). A run that starts nine
processes at once pays that nine times over on the same cores. ``LocalProc`` asks a zygote instead (the
local backend; ``FORGE_ZYGOTE=0`` turns it off): the fork takes milliseconds and the child
shares the imported modules' pages with the zygote until it writes to them.

A child is the process ``python -m controller._worker`` would have been:

- the zygote started with the child's environment, less the names read only when a process
  runs (``FORGE_*``, which ``controller.env_vars`` never reads at import, and
  torch.distributed's ``RANK``/``MASTER_PORT``/...), and in the same working directory. A
  spawn whose environment differs in any other name (``OMP_NUM_THREADS``, ``PYTHONHASHSEED``,
  ``CUDA_VISIBLE_DEVICES``, ``HF_*``: read at import or at interpreter start) gets a zygote of
  its own;
- the child then takes its full environment, its own session (``setsid``), its stdout and
  stderr pipes and the pipes ``LocalProc`` hands it (passed over the zygote's socket with
  ``SCM_RIGHTS``), reseeds numpy's global generator (torch's default seed is a constant in
  any fresh process, and Python's ``random`` reseeds itself at fork), and runs
  ``controller._worker`` as ``__main__``;
- the zygote never runs a torch op (a fork after OpenMP has started threads is not safe), and
  has no thread of its own at a fork;
- the zygote makes itself non-dumpable (``not_dumpable``) before anything else, so a child is
  non-dumpable from the fork on, and the descriptors the zygote holds for a moment on a
  child's way (the session's secret comes through one) are closed to other processes of the
  user.

The zygote reports each child's exit status over its socket. It talks only over a socketpair
made by the process that started it (nothing listens), exits when that process's end closes,
and is stopped with the runtime (``close_all``). Anything that goes wrong starting or asking
a zygote falls back to a plain ``subprocess.Popen``, with a warning.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Any

logger = logging.getLogger("controller")

# Names read only while a process runs, never at import: they may differ between the
# children of one zygote. (torch's inductor sets TORCHINDUCTOR_CACHE_DIR in the controller's
# environment the first time it asks for its cache directory, in the middle of a run.)
RUNTIME_ONLY = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHINDUCTOR_CACHE_DIR",
)
_MAX_MSG = 1 << 20
_MAX_FDS = 16
REPLY_TIMEOUT_S = 30.0  # one fork, once the zygote has imported (its start has its own bound)
START_TIMEOUT_S = 120.0


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """The part of a child's environment its zygote must have started with."""
    return {k: v for k, v in env.items() if not k.startswith("FORGE_") and k not in RUNTIME_ONLY}


def zygote_key(env: dict[str, str]) -> tuple:
    """Which zygote may fork a child with ``env``: the same interpreter, working directory,
    preload list and start-up environment."""
    preload = env.get("FORGE_PRELOAD", "")
    return (sys.executable, os.getcwd(), preload, tuple(sorted(zygote_env(env).items())))


class ZygoteChild:
    """What ``LocalProc`` uses of a ``Popen``, for a process a zygote forked: ``pid``,
    ``stdout`` and ``stderr`` (binary streams), ``wait()``."""

    def __init__(self, pid: int, stdout, stderr):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status (``-N`` for signal N, as ``Popen``), once the zygote reports it."""
        self._done.wait(timeout)
        return self.returncode

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class Zygote:
    """The controller's side of one zygote process."""

    def __init__(self, env: dict[str, str], preload: str):
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.popen = self._start(there, env, preload)
        except BaseException:
            here.close()
            raise
        finally:
            there.close()
        self.sock = here
        self.alive = True
        self._lock = threading.Lock()  # one request at a time: replies come in order
        self._replies: queue.Queue[dict] = queue.Queue()
        self._children: dict[int, ZygoteChild] = {}
        self._started = False
        threading.Thread(target=self._read, daemon=True, name="forge-zygote").start()

    def _start(self, there: socket.socket, env: dict[str, str], preload: str) -> Any:
        """Start the zygote process on ``there`` (its end of the socket); a ``Popen`` (or what
        ``close`` uses of one: ``wait(timeout)``, ``kill()``)."""
        return subprocess.Popen(  # a script, not -m: the zygote imports no controller
            [sys.executable, os.path.abspath(__file__), str(there.fileno()), preload],
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(there.fileno(),),
            start_new_session=True,  # Ctrl-C goes to the controller, as for workers
        )

    def spawn(self, env: dict[str, str], fds: dict[str, int]) -> ZygoteChild:
        """Fork a worker with environment ``env`` (its ``fds`` names get the numbers the child
        holds them at); ``RuntimeError`` if the zygote cannot."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        names = ["stdout", "stderr", *fds]
        try:
            with self._lock:
                if not self.alive:
                    raise RuntimeError("the zygote has exited")
                msg = json.dumps({"env": env, "fds": names, "cwd": os.getcwd()}).encode()
                socket.send_fds(self.sock, [msg], [out_w, err_w, *fds.values()])
                timeout = REPLY_TIMEOUT_S if self._started else START_TIMEOUT_S
                try:
                    reply = self._replies.get(timeout=timeout)
                except queue.Empty:
                    self.close()
                    raise RuntimeError(f"the zygote did not fork within {timeout:.0f} s") from None
                self._started = True
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if "pid" not in reply:
            os.close(out_r)
            os.close(err_r)
            raise RuntimeError(f"the zygote could not fork: {reply.get('error')}")
        child = reply["child"]
        child.stdout, child.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
        return child

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MAX_MSG)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if "exit" in msg:
                child = self._children.pop(msg["exit"], None)
                if child is not None:
                    child._exited(msg["code"])
                continue
            if "pid" in msg:  # known before the spawner hears of it: its exit cannot come first
                msg["child"] = self._children[msg["pid"]] = ZygoteChild(msg["pid"], None, None)
            self._replies.put(msg)
        self.alive = False
        self._replies.put({"error": "the zygote exited"})
        for pid, child in list(self._children.items()):  # they live on; watch them by pid
            threading.Thread(target=_await_orphan, args=(pid, child), daemon=True).start()
        self._children.clear()

    def close(self) -> None:
        """Stop the zygote (its children have their own lifelines and are not touched)."""
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.popen.wait(5.0)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5.0)
        self.sock.close()


def _await_orphan(pid: int, child: ZygoteChild) -> None:
    """A child whose zygote died: wait for its end by pid (its status is then unknown: 1)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        child._exited(1)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)
    logger.warning("pid %d ended after its zygote; its exit status is unknown", pid)
    child._exited(1)


_zygotes: dict[tuple, Zygote] = {}
_zlock = threading.Lock()


def spawn_worker(env: dict[str, str], fds: dict[str, int]) -> ZygoteChild | None:
    """A worker forked by the zygote for ``env`` (started on first use), or ``None`` when
    ``env`` names no modules to preload (``FORGE_PRELOAD``, comma-separated), zygotes are off
    (``FORGE_ZYGOTE=0``) or none can serve it: the caller then starts a plain process."""
    from controller import env_vars

    preload = env.get(env_vars.PRELOAD, "")
    if not preload or not env_vars.zygote():
        return None
    try:
        with _zlock:
            key = zygote_key(env)
            z = _zygotes.get(key)
            if z is None or not z.alive:
                z = _zygotes[key] = Zygote(zygote_env(env), preload)
        return z.spawn(env, fds)
    except (OSError, RuntimeError, ValueError) as e:
        logger.warning(
            "could not fork an actor process from a zygote (%s); starting it the plain way", e
        )
        return None


def close_all() -> None:
    """Stop every zygote this process started."""
    with _zlock:
        zs = list(_zygotes.values())
        _zygotes.clear()
    for z in zs:
        z.close()


# -- the zygote process ---------------------------------------------------------------------


def not_dumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: other processes of the same user (a sandboxed tool's
    program) may then neither open this one's ``/proc/<pid>/fd/*``, read its ``environ`` or
    memory, nor ptrace it; a child it forks inherits that, ``exec`` undoes it. Root (and
    ``CAP_SYS_PTRACE``) still can. ``OSError`` if the kernel refuses; elsewhere than Linux,
    a no-op (no ``/proc``)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # 4: PR_SET_DUMPABLE
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(errno)}")


def main() -> None:
    not_dumpable()  # before it holds anything: each child's descriptors pass through here
    sys.path[0] = os.getcwd()  # as ``python -m`` has it (a script's own folder is first)
    sock = socket.socket(fileno=int(sys.argv[1]))
    _title_setup()
    for name in filter(None, sys.argv[2].split(",")):
        try:
            __import__(name.strip())
        except Exception:  # noqa: BLE001 - a child then imports what it needs itself
            pass
    serve(sock)


def serve(sock: socket.socket, after_fork=None) -> None:
    """The zygote's loop: fork a child per request on ``sock``, report exits; never returns.
    ``after_fork(env)``: called in each child once its environment is in place."""
    gc.collect()
    gc.freeze()  # the imported objects stay out of the children's collections (fewer copies)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(sock)
        if sock not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, _MAX_FDS)
        except OSError:
            break
        if not msg:
            break  # the controller's end closed
        req = json.loads(msg)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            reply = {"error": str(e)}
        else:
            if pid == 0:
                _child(req, fds, (sock.fileno(), wake_r, wake_w), after_fork)
            reply = {"pid": pid}
        for fd in fds:
            os.close(fd)
        try:
            sock.send(json.dumps(reply).encode())
        except OSError:
            break
    os._exit(0)


def _title_setup() -> None:
    """Let setproctitle find the command line's memory now: a child that has replaced its
    environment (as each does) leaves it nothing to find it by, and ``ps`` would show every
    worker as this zygote (``controller._worker`` sets the title)."""
    os.environ["SPT_NOENV"] = "1"  # (the environment's own space is left alone)
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:
            return


def _child(req: dict, fds: list[int], zygote_fds: tuple[int, ...], after_fork=None) -> None:
    """In the forked child: become the worker ``req`` describes; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in zygote_fds:
            os.close(fd)
        os.setsid()
        by_name = dict(zip(req["fds"], fds))
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, to in ((devnull, 0), (by_name.pop("stdout"), 1), (by_name.pop("stderr"), 2)):
            os.dup2(fd, to)
            os.close(fd)
        env = dict(req["env"])
        for name, fd in by_name.items():  # the names LocalProc gave: where the child holds them
            os.set_inheritable(fd, True)
            env[name] = str(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if after_fork is not None:
            after_fork(env)
        import runpy

        sys.argv = ["-m"]
        runpy.run_module("controller._worker", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, as Python would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, io.UnsupportedOperation):
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
