"""Shared helpers for tests that run real processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def script_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def write_script(tmp_path: Path, code: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def run_script(tmp_path: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    path = write_script(tmp_path, code)
    return subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env=script_env(),
    )


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it exited (and was reaped) meanwhile
        return False


def wait_dead(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if pid_alive(p)]
        time.sleep(0.05)
    return alive


def forge_run(
    args: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``forge run <args>`` in a real process from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", *args],
        capture_output=True,
        text=True,
        env=env or script_env(),
        cwd=REPO,
        timeout=timeout,
    )


def tiny_grpo_config(tmp_path: Path, steps: int, extra: str = "") -> Path:
    """A GRPO app config on a freshly built tiny model (sum of digits, 2 prompts x 4 per
    step, no evaluation), with ``extra`` YAML lines appended; returns its path."""
    from forge.models import make_tiny_model

    model = make_tiny_model(tmp_path / "model", preset="tiny")
    path = tmp_path / "grpo.yaml"
    path.write_text(
        f"""
app: apps.grpo.main
policy: {{model: {model}}}
steps: {steps}
data: {{fn: apps.sumdigits.task:SumDigits, kwargs: {{digits_min: 1, digits_max: 2}}}}
rewards: [apps.sumdigits.task:sumdigits_reward]
rollout: {{prompts_per_step: 2, group_size: 4, max_tokens: 4, tasks: 2}}
generator: {{max_batch_size: 16}}
trainer: {{optimizer: {{lr: 1.0e-4}}}}
eval: {{at_start: false, at_end: false}}
{extra}
"""
    )
    return path


def actor_processes(root_pid: int, prefix: str = "") -> dict[int, str]:
    """The actor worker processes below ``root_pid`` whose mesh name starts with ``prefix``:
    ``{pid: mesh}``. Only workers themselves, known by their title (``forge-worker <mesh>
    <rank>/<size> (controller._worker)``, which a forked worker's environment block cannot
    show): a helper process a worker starts (multiprocessing's resource tracker, ...) is not
    the actor."""
    import psutil

    found = {}
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            words = " ".join(child.cmdline()).split()
        except psutil.Error:
            continue
        if len(words) > 2 and words[0] == "forge-worker" and words[1].startswith(prefix):
            found[child.pid] = words[1]
    return found


def run_metrics(run: Path) -> list[dict]:
    """The rows of a GRPO run directory's ``metrics.jsonl`` (none before it exists)."""
    from forge.observability import read_jsonl

    return read_jsonl(run / "metrics.jsonl")


def run_killing_a_generator(config: Path, run: Path, kill_at: int) -> dict:
    """``forge run`` of ``config`` with two generator replicas, one SIGKILLed once ``kill_at``
    steps are trained; waits for the run's end. Returns ``returncode``, ``out``, ``err``,
    ``gens`` (generator pid -> mesh at the kill), ``victim`` and ``trained_at_kill``.

    From the kill until the service has the replica back (``status.json``), the run's
    dataset process is paused (SIGSTOP): no new rollouts start, so the run cannot end before
    the restarted replica serves. A restart takes 4-14 s on two busy cores, more than a tiny
    run's remaining steps may last (which made these tests flaky)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "run", "--config", str(config), "--run-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(),
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 300
        while len([r for r in run_metrics(run) if "train/loss" in r]) < kill_at:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"not {kill_at} steps within 300 s"
            time.sleep(0.05)
        gens = actor_processes(proc.pid, "Generator-r")
        assert len(gens) == 2, gens
        victim = min(gens)
        trained = max(r["step"] for r in run_metrics(run) if "train/loss" in r)
        paused = list(actor_processes(proc.pid, "DatasetActor"))
        assert paused, actor_processes(proc.pid, "")
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            os.kill(victim, signal.SIGKILL)
            _wait_generator_back(run, victim, proc)
        finally:
            for pid in paused:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=400)
        except subprocess.TimeoutExpired:  # a stalled run: its tasks' awaits, then its output
            for pid in [proc.pid, *actor_processes(proc.pid, "")]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)  # controller.task_dump
            time.sleep(2)
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(
                f"the run did not end within 400 s of the kill:\n{err[-8000:]}"
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return {
        "returncode": proc.returncode,
        "out": out,
        "err": err,
        "gens": gens,
        "victim": victim,
        "trained_at_kill": trained,
    }


def _wait_generator_back(run: Path, victim: int, proc: subprocess.Popen) -> None:
    """Until ``status.json`` shows the Generator service's replica that had process
    ``victim`` healthy again, restarted (120 s at most)."""
    import json

    deadline, last = time.monotonic() + 120, None
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((run / "status.json").read_text())
            for svc in status.get("services", []):
                if svc["name"] != "Generator":
                    continue
                last = svc["replicas"]
                if any(
                    r["restarts"] >= 1 and r["state"] == "healthy" and victim not in r["pids"]
                    for r in last
                ):
                    return
        time.sleep(0.1)
    raise AssertionError(f"the killed generator replica was not back within 120 s: {last}")


async def replica_restarted(svc, victim: int, timeout: float = 30) -> None:
    """Wait until the service's first replica is healthy again in a process other than
    ``victim`` (the pid a test killed); fails with the replica's metrics after ``timeout``."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = svc.metrics()[0]
        if m["state"] == "healthy" and m["pids"][0] != victim:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica 0 not restarted within {timeout} s: {svc.metrics()[0]}")
