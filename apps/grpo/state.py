"""Run state for RL apps: metrics per step (with backends) and checkpoints for ``--resume``."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

from forge.observability import build_backends, get_collector, merge_states
from forge.observability.status import StepStatus


def actor_env(threads: int) -> dict[str, str]:
    """Environment for the app's actor processes: no download progress bars, and their torch
    threads. ``threads=0`` (the default of the apps' ``threads_per_actor``): the host's thread
    budget (``controller.threads``) hands cores to whichever components are computing, one
    thread at rest. ``threads=N``: a fixed N threads per process, budget off."""
    env = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    if threads < 0:
        raise ValueError(f"threads_per_actor must be >= 0 (0: thread budget), got {threads}")
    env["OMP_NUM_THREADS"] = str(threads or 1)
    env["FORGE_THREAD_BUDGET"] = "0" if threads else "1"
    return env


class MetricLog:
    """Collects metrics between steps, reduces them per step, writes them to backends and
    to the run's live status (``forge top``; ``steps``: the run's length, if known)."""

    def __init__(self, run_dir: Path, backends: list[str], steps: int | None = None):
        self.backends = build_backends(backends, run_dir)
        self.status = StepStatus(Path(run_dir).name, steps)
        self.history: list[dict[str, float]] = []
        self._pending: dict[str, list[float]] = {}
        self._remote: list[dict] = []
        self._t = time.perf_counter()

    def merge(self, states: list[dict]) -> None:
        """Metric states flushed by actor processes (reduced with the local ones at step)."""
        self._remote.extend(states)

    def add(self, key: str, values: list[float]) -> None:
        self._pending.setdefault(key, []).extend(values)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **metrics}
        self.history.append(row)
        for b in self.backends:
            b.log(step, metrics)
        self.status.eval(step, metrics)

    def record_remote(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` plus the actor states merged since the last step as an extra
        row for ``step`` (the run's last flush, which arrives after its last step)."""
        self.record(step, {**metrics, **merge_states(self._remote)})
        self._remote = []

    def step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Log ``metrics`` plus the means of what was ``add``ed since the last step and of
        anything recorded with ``record_metric`` in this process."""
        out = dict(metrics)
        for key, values in self._pending.items():
            if values:
                out[key] = statistics.fmean(values)
        self._pending = {}
        out.update(merge_states([get_collector().flush(), *self._remote]))
        self._remote = []
        now = time.perf_counter()
        out["time/elapsed_s"] = now - self._t
        self.record(step, out)
        self.status.step(step, out)
        return out

    def close(self) -> None:
        for b in self.backends:
            b.close()


class Checkpointer:
    """Every ``every`` steps: trainer (model, optimizer, schedule, RNG), replay buffer and
    dataset position, written to ``<run_dir>/checkpoints/step_N`` then published atomically
    by renaming and pointing ``latest`` at it."""

    def __init__(self, run_dir: Path, every: int):
        self.root = Path(run_dir) / "checkpoints"
        self.every = every

    async def maybe_save(self, step: int, trainer, buffer, data) -> Path | None:
        if not self.every or step % self.every:
            return None
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        await trainer.save.call(str(tmp / "trainer"))
        state = {
            "step": step,
            "buffer": await buffer.state_dict.call_one(),
            "data": await data.state_dict.call_one(),
        }
        import torch  # pickles python RNG tuples and tensors alike

        torch.save(state, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (self.root / "latest.tmp").write_text(json.dumps({"step": step, "dir": final.name}))
        os.replace(self.root / "latest.tmp", self.root / "latest")
        return final

    def latest(self) -> Path | None:
        """The directory of the last published checkpoint (``None``: none yet)."""
        marker = self.root / "latest"
        if not marker.is_file():
            return None
        return self.root / json.loads(marker.read_text())["dir"]

    def latest_step(self) -> int | None:
        """The step of the last published checkpoint (``None``: none yet)."""
        marker = self.root / "latest"
        if not marker.is_file():
            return None
        return int(json.loads(marker.read_text())["step"])

    async def restore(self, trainer, buffer, data) -> int:
        """Load the latest checkpoint into the actors; returns its step (0 if none)."""
        path = self.latest()
        if path is None:
            return 0
        import torch

        state = torch.load(path / "state.pt", weights_only=False)
        await trainer.load.call(str(path / "trainer"))
        await buffer.load_state_dict.call_one(state["buffer"])
        await data.load_state_dict.call_one(state["data"])
        print(f"[forge] resumed from {path} (step {state['step']})", flush=True)
        return int(state["step"])
