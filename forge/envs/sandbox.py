"""Run untrusted Python (model-written code) in a separate, limited process.

``run_python(code)`` starts a fresh interpreter in isolated mode (``-I``: no user site, no
``PYTHON*`` variables, no script directory on ``sys.path``; plus ``-S``: no site-packages
unless ``allow_site_packages``) with:

- an environment holding only a minimal ``PATH`` (no inherited variables, so no secrets);
- a fresh temporary working directory, deleted afterwards;
- resource limits: address space (``memory_mb``), CPU seconds, the size of files it writes
  (which also bounds its output), no core dumps, and ``max_procs`` more processes than its
  user already runs (``RLIMIT_NPROC``, which Linux counts in threads of all the user's
  processes: the limit is their number at the start plus ``max_procs``; a fork bomb stops
  there; root is exempt);
- its whole process tree killed (``SIGKILL``) at the wall-clock timeout and when it exits,
  and also when the process that called ``run_python`` dies (an actor SIGKILLed mid-call),
  the temporary directories then removed as well.

A small supervisor (``_sandbox_boot.py``, run by the same isolated interpreter) sets the
limits, then starts the program in a new user and PID namespace where the kernel allows one
(the program is process 1 there: when it ends, the kernel kills every process in the
namespace, ``setsid`` or not, and none can signal a process outside it). Where it does not,
the supervisor is a child subreaper, so orphaned descendants come back to it and it kills
them all; a program that kills its supervisor first can then escape. The supervisor keeps the
wall-clock limit itself and dies with its caller (``PR_SET_PDEATHSIG``), so neither depends on
the caller living on; ``run_python``'s own wait is only a backstop. The supervisor is not
set up with ``subprocess``'s ``preexec_fn``: CPython documents that as unsafe in a
multi-threaded parent, and actors are multi-threaded.

The session's secret is not reachable from here: actor processes receive it over a socket,
only once they are non-dumpable, never in their environment, so a program running as the same
user can take it neither from their ``/proc/<pid>/environ`` or ``/proc/<pid>/fd`` nor from
their memory (``controller._worker``).

This is a resource sandbox, not a security boundary: the code runs as the same user and can
read and write what that user can (files, other processes of the user that are dumpable).
Run environments in their own containers for adversarial code (docs/security.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from forge.envs.tools import Tool

__all__ = ["SandboxResult", "python_tool", "run_python"]

MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_FILE_LIMIT = 8 * 1024 * 1024  # bytes a sandboxed program may write to any one file

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")
KILL_GRACE_S = 6.0  # the supervisor's own kill loop is bounded by 5 s
LATE_S = 1.0  # past the timeout, a supervisor that has not ended is told to (SIGTERM)
# Try a user + PID namespace (tests turn it off to try the subreaper-only path).
USE_NAMESPACES = True


@dataclass
class SandboxResult:
    """What a sandboxed run printed and how it ended.

    ``exit_code`` is the process's (negative: killed by that signal, e.g. -9 at the timeout);
    ``truncated`` says stdout or stderr was cut to ``max_output_chars``.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool

    def to_text(self) -> str:
        """The result as a tool observation: stdout, then stderr and the ending if notable."""
        parts = [self.stdout] if self.stdout else []
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        if self.timed_out:
            parts.append("[timed out]")
        elif self.exit_code != 0:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "[no output]"


def _cut(text: str, total_bytes: int, limit: int, keep_tail: bool) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    note = f"[... truncated to {limit} characters of {total_bytes} bytes ...]"
    if keep_tail:  # the end of stderr holds the exception
        return f"{note}\n{text[-limit:]}", True
    return f"{text[:limit]}\n{note}", True


def _read(path: str, limit: int, tail: bool) -> tuple[str, int]:
    """Up to ``limit`` bytes of the file (its start, or its end) as text, and its size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if tail:
            f.seek(max(0, size - limit))
        data = f.read(limit)
    return data.decode("utf-8", errors="replace"), size


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_chars: int = 2000,
    allow_site_packages: bool = False,
    max_procs: int = 64,
) -> SandboxResult:
    """Run ``code`` in a fresh limited interpreter; see the module docstring. ``max_procs``:
    processes (threads) the program may add to its user's (``RLIMIT_NPROC``).

    Blocks for at most about ``timeout_s`` seconds (call it from a thread in async code).
    stdout keeps its first ``max_output_chars`` characters, stderr its last.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars <= 0 or max_procs <= 0:
        raise ValueError(
            "run_python needs timeout_s, memory_mb and max_output_chars (and max_procs) > 0, got "
            f"{timeout_s}, {memory_mb}, {max_output_chars}, {max_procs}"
        )
    workdir = tempfile.mkdtemp(prefix="forge-sandbox-")
    outdir = tempfile.mkdtemp(prefix="forge-sandbox-out-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        flags = ["-I"] if allow_site_packages else ["-I", "-S"]
        limits = [memory_mb * 1024 * 1024, int(timeout_s) + 1, OUTPUT_FILE_LIMIT, max_procs]
        program = [sys.executable, *flags, "main.py"]
        status_r, status_w = os.pipe()  # the supervisor writes the program's ending here
        limits += [status_w, int(USE_NAMESPACES), os.getpid(), timeout_s]
        argv = [
            sys.executable,
            "-I",
            "-S",
            _BOOT,
            *map(str, limits),
            workdir,
            outdir,
            "--",
            *program,
        ]
        out_path, err_path = os.path.join(outdir, "stdout"), os.path.join(outdir, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env={"PATH": MINIMAL_PATH},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(status_w,),
                    start_new_session=True,  # its own process group, killed as a whole too
                )
            finally:
                os.close(status_w)
            with os.fdopen(status_r, "rb") as status:
                timed_out, code = _wait(proc, timeout_s, status)
        read_limit = 4 * max_output_chars + 4096  # utf-8: at most 4 bytes a character
        stdout, cut_out = _cut(*_read(out_path, read_limit, False), max_output_chars, False)
        stderr, cut_err = _cut(*_read(err_path, read_limit, True), max_output_chars, True)
        return SandboxResult(stdout, stderr, code, timed_out, cut_out or cut_err)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)


def _wait(proc: subprocess.Popen, timeout_s: float, status) -> tuple[bool, int]:
    """Wait for the supervisor, which ends the program at ``timeout_s`` itself; should it be
    late, tell it to (``SIGTERM``), then kill its process group. Returns (timed out, the
    program's exit code: negative for the signal that killed it, e.g. -9 at the timeout)."""
    late = False
    try:
        proc.wait(timeout=timeout_s + LATE_S)
    except subprocess.TimeoutExpired:
        late = True
        proc.send_signal(signal.SIGTERM)  # the supervisor kills the tree and exits
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left in its process group
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    reported = status.read().decode().split()  # nothing if the supervisor was killed
    if reported:
        return late or reported[1] == "1", int(reported[0])
    return late, -signal.SIGKILL


def python_tool(
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_chars: int = 2000,
    allow_site_packages: bool = False,
    max_procs: int = 64,
) -> Tool:
    """A ``python`` tool running its ``code`` argument with :func:`run_python`.

    The observation is what the program printed (stdout; stderr and a timeout or non-zero
    exit are noted), so the model must ``print`` what it wants to see.
    """

    def python(code: str) -> SandboxResult:
        return run_python(
            code, timeout_s, memory_mb, max_output_chars, allow_site_packages, max_procs
        )

    return Tool(
        name="python",
        fn=python,
        schema={
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source to run as a script"}
            },
            "required": ["code"],
        },
        description=(
            "Run a Python script in a fresh sandboxed interpreter and return what it printed "
            f"(time limit {timeout_s:g} s; nothing is kept between calls)."
        ),
    )
