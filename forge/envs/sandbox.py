"""Run untrusted Python (model-written code) in a separate, limited process.

``run_python(code)`` starts a fresh interpreter in isolated mode (``-I``: no user site, no
``PYTHON*`` variables, no script directory on ``sys.path``; plus ``-S``: no site-packages
unless ``allow_site_packages``) with:

- an environment holding only a minimal ``PATH`` (no inherited variables, so no secrets);
- a fresh temporary working directory, deleted afterwards;
- resource limits: address space (``memory_mb``), CPU seconds, the size of files it writes
  (which also bounds its output) and no core dumps;
- its own process group, killed as a whole (``SIGKILL``) at the wall-clock timeout and
  after it exits (so background children do not outlive it).

The limits are set by a two-line bootstrap interpreter that then ``exec``s the real one
(limits survive ``exec``), not by ``subprocess``'s ``preexec_fn``: CPython documents
``preexec_fn`` as unsafe in a multi-threaded parent, and actors are multi-threaded.

This is a resource sandbox, not a security boundary: the code runs as the same user and can
read what that user can. Run environments in their own containers for adversarial code.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from forge.envs.tools import Tool

__all__ = ["SandboxResult", "python_tool", "run_python"]

MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_FILE_LIMIT = 8 * 1024 * 1024  # bytes a sandboxed program may write to any one file

_BOOTSTRAP = (
    "import os, resource, sys\n"
    "mem, cpu, fsize = (int(a) for a in sys.argv[1:4])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (mem, mem))\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[4:]])\n"
)


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
) -> SandboxResult:
    """Run ``code`` in a fresh limited interpreter; see the module docstring.

    Blocks for at most about ``timeout_s`` seconds (call it from a thread in async code).
    stdout keeps its first ``max_output_chars`` characters, stderr its last.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars <= 0:
        raise ValueError(
            "run_python needs timeout_s, memory_mb and max_output_chars > 0, got "
            f"{timeout_s}, {memory_mb}, {max_output_chars}"
        )
    workdir = tempfile.mkdtemp(prefix="forge-sandbox-")
    outdir = tempfile.mkdtemp(prefix="forge-sandbox-out-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        flags = ["-I"] if allow_site_packages else ["-I", "-S"]
        limits = [str(memory_mb * 1024 * 1024), str(int(timeout_s) + 1), str(OUTPUT_FILE_LIMIT)]
        argv = [sys.executable, *flags, "-c", _BOOTSTRAP, *limits, *flags, "main.py"]
        out_path, err_path = os.path.join(outdir, "stdout"), os.path.join(outdir, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env={"PATH": MINIMAL_PATH},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group, killed as a whole
            )
            timed_out = _wait(proc, timeout_s)
        read_limit = 4 * max_output_chars + 4096  # utf-8: at most 4 bytes a character
        stdout, cut_out = _cut(*_read(out_path, read_limit, False), max_output_chars, False)
        stderr, cut_err = _cut(*_read(err_path, read_limit, True), max_output_chars, True)
        return SandboxResult(stdout, stderr, proc.returncode, timed_out, cut_out or cut_err)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to ``timeout_s``; then kill the whole process group. True if it timed out."""
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also any children it left behind
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def python_tool(
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_chars: int = 2000,
    allow_site_packages: bool = False,
) -> Tool:
    """A ``python`` tool running its ``code`` argument with :func:`run_python`.

    The observation is what the program printed (stdout; stderr and a timeout or non-zero
    exit are noted), so the model must ``print`` what it wants to see.
    """

    def python(code: str) -> SandboxResult:
        return run_python(code, timeout_s, memory_mb, max_output_chars, allow_site_packages)

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
