"""Score items in a child process that is killed when one item overruns its time bound.

A reward function that parses or simplifies model output (``MathReward``: sympy) can be made
to run for ever by one answer (``\\boxed{9^{9^{9^{9}}}}``), in C code that no signal or
thread can interrupt. ``BoundedScorer`` runs such work in a child process instead: a batch
of items goes to the child in one message and their results come back one by one; when an
item is not answered within ``timeout_s`` of the previous answer, the child is SIGKILLed,
that item's result is ``TIMED_OUT`` and the rest of the batch goes to a fresh child.

    scorer = BoundedScorer("forge.rewards.math_reward:score_pair", timeout_s=5.0)
    scorer.map([["42", "6*7"], ...])   # [{"ok": 1.0}, {"timed_out": 5.0}, ...]

The child (``python -m forge.rewards.bounded <module:function> <memory MiB> <parent pid>``)
imports the function once, calls the module's ``warm_up()`` if it has one (lazy imports and
first-call costs are paid at start, under ``start_timeout_s``, not by the first item's
bound), limits its own address space (a huge intermediate ends in
``MemoryError``, scored as an error, not in the host's OOM killer), dies with its parent
(``PR_SET_PDEATHSIG``; it also stays in the parent's process group, which Forge's workers kill
whole) and speaks JSON lines on stdin/stdout, so the parent never unpickles anything the
child computed. Its stderr goes to /dev/null: library warnings do not reach the terminal.

Items and results must be JSON values. Thread-safe: concurrent ``map`` calls take turns on
``workers`` children (started on first use).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["BoundedScorer"]

logger = logging.getLogger("forge.rewards")

_READY = "ready"


class _Child:
    """One child process and the unread bytes of its stdout."""

    def __init__(self, target: str, max_memory_mb: int, start_timeout_s: float) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [
            sys.executable,
            "-m",
            "forge.rewards.bounded",
            target,
            str(max_memory_mb),
            str(os.getpid()),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buf = b""
        line = self.read_line(time.monotonic() + start_timeout_s)
        if line != _READY:
            self.kill()
            raise RuntimeError(
                f"the scoring process for {target} did not start within {start_timeout_s} s "
                f"(it said {line!r}; exit code {self.proc.returncode})"
            )

    def send(self, items: list) -> bool:
        try:
            self.proc.stdin.write(json.dumps(items).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):  # it died, or was killed and its pipes closed
            return False

    def read_line(self, deadline: float) -> Any:
        """The next JSON line, ``None`` at end of file, or ``_Timeout`` past ``deadline``."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return _Timeout
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return _Timeout
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


class _TimeoutType:
    def __repr__(self) -> str:
        return "<timed out>"


_Timeout = _TimeoutType()


class BoundedScorer:
    """Runs ``target`` (``"module:function"``, a function of one JSON item returning a JSON
    value) on batches of items in up to ``workers`` child processes, each item within
    ``timeout_s`` seconds.

    ``map`` returns one dict per item: ``{"ok": value}``, ``{"error": "Type: message"}`` (the
    function raised), ``{"timed_out": seconds}`` (the child was killed) or ``{"died": code}``
    (the child died on that item twice, e.g. killed for memory).
    """

    def __init__(
        self,
        target: str,
        timeout_s: float = 5.0,
        workers: int = 1,
        max_memory_mb: int = 4096,
        start_timeout_s: float = 120.0,
    ) -> None:
        if timeout_s <= 0 or workers < 1:
            raise ValueError(
                f"BoundedScorer: timeout_s must be > 0 and workers >= 1, got {timeout_s}, {workers}"
            )
        self.target, self.timeout_s, self.workers = target, timeout_s, workers
        self.max_memory_mb, self.start_timeout_s = max_memory_mb, start_timeout_s
        self._idle: queue.SimpleQueue[_Child | None] = queue.SimpleQueue()
        for _ in range(workers):
            self._idle.put(None)  # a slot; the child starts on first use
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self.killed = 0  # children killed for overrunning (for tests and logs)

    def map(self, items: list) -> list[dict]:
        """Score ``items`` (see the class docstring)."""
        child = self._idle.get()
        try:
            out: list[dict] = []
            retried, lost = False, 0
            while len(out) < len(items):
                if child is None or child.proc.poll() is not None:
                    child = self._start()
                pending = items[len(out) :]
                if not child.send(pending):
                    child, lost = self._drop(child), lost + 1
                    if lost > 3:
                        raise RuntimeError(
                            f"the scoring process for {self.target} keeps "
                            "dying before it reads its work"
                        )
                    continue
                for _ in pending:
                    reply = child.read_line(time.monotonic() + self.timeout_s)
                    if reply is _Timeout:
                        self.killed += 1
                        out.append({"timed_out": self.timeout_s})
                        child = self._drop(child)
                        break
                    if reply is None:  # it died on this item: once may be bad luck
                        code = child.proc.wait()
                        child = self._drop(child)
                        if retried:
                            out.append({"died": code})
                            retried = False
                        else:
                            retried = True
                        break
                    out.append(reply)
                    retried = False
            return out
        finally:
            self._idle.put(child)

    def close(self) -> None:
        """Kill every child (idempotent; a later ``map`` starts new ones)."""
        with self._lock:
            children, self._children = list(self._children), set()
        for c in children:
            c.kill()

    def _start(self) -> _Child:
        child = _Child(self.target, self.max_memory_mb, self.start_timeout_s)
        with self._lock:
            self._children.add(child)
        return child

    def _drop(self, child: _Child) -> None:  # returns None: the slot is empty again
        child.kill()
        with self._lock:
            self._children.discard(child)
        return None

    def __del__(self) -> None:
        try:  # not contextlib: at interpreter exit this module's globals may be gone already
            self.close()
        except Exception:  # noqa: BLE001 - a finaliser must not raise
            pass


# -- the child ---------------------------------------------------------------------------------


def _child_setup(max_memory_mb: int, parent: int) -> None:
    import resource
    import warnings

    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
    limit = max_memory_mb * (1 << 20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(
        resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard)
    )
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # library log lines are noise here; results say it all


def _child_main(target: str, max_memory_mb: int, parent: int) -> None:
    _child_setup(max_memory_mb, parent)
    # The protocol keeps fd 1 to itself; whatever the scored code prints goes to /dev/null.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    module, _, name = target.partition(":")
    mod = importlib.import_module(module)
    fn = getattr(mod, name)
    if callable(getattr(mod, "warm_up", None)):
        mod.warm_up()  # before READY: counted against start_timeout_s

    def say(obj: Any) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    say(_READY)
    for line in sys.stdin.buffer:
        for item in json.loads(line):
            try:
                say({"ok": fn(item)})
            except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
                say({"error": f"{type(e).__name__}: {str(e)[:500]}"})


if __name__ == "__main__":
    _child_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
