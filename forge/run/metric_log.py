"""A run's step metrics: collected between steps, reduced per step, written to the metric
backends (``metrics: [jsonl, tensorboard, wandb, console]``) and to the live status that
``forge top`` shows.

    log = MetricLog(run_dir, ["jsonl"], steps=cfg.steps)
    log.add(M.REWARD, [0.5, 1.0])                # any number of values between steps
    row = log.step(version, {M.TRAIN_S: 0.12})  # the step's row: means of what was added,
                                                # this process's and the actors' metrics
    log.record(version, {M.HELDOUT_ACCURACY: 0.9})  # an extra row (an evaluation)
    log.close()

Metric names with a meaning Forge reads are ``forge.observability.names.M``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from forge.observability import build_backends, get_collector, merge_states
from forge.observability.alerts import RewardAlerts, TruncationAlerts
from forge.observability.episode_log import EpisodeSamples
from forge.observability.names import M
from forge.observability.status import StepStatus

__all__ = ["MetricLog", "progress", "step_row"]


class MetricLog:
    """Collects metrics between steps, reduces them per step, writes them to backends and
    to the run's live status (``forge top``; ``steps``: the run's length, if known)."""

    def __init__(self, run_dir: Path, backends: list[str], steps: int | None = None):
        self.backends = build_backends(backends, run_dir)
        self.status = StepStatus(Path(run_dir).name, steps)
        self.episodes = EpisodeSamples(run_dir)  # a sample of each step's episodes
        self.history: list[dict[str, float]] = []
        self._pending: dict[str, list[float]] = {}
        self._cut: tuple[str, dict[str, list[float]]] | None = None  # (prefix, values)
        self._remote: list[dict] = []
        self._t = time.perf_counter()
        self.alerts = RewardAlerts()
        self.truncation = TruncationAlerts()

    def merge(self, states: list[dict]) -> None:
        """Metric states flushed by actor processes (reduced with the local ones at step)."""
        self._remote.extend(states)

    def add(self, key: str, values: list[float]) -> None:
        """Values of ``key`` for the next step's row (which logs their mean)."""
        self._pending.setdefault(key, []).extend(values)

    def cut(self, prefix: str) -> None:
        """End the next row's share of the keys starting with ``prefix``: values added so
        far go to the next ``step`` row, values added after it to the row after. A loop calls
        it where a step's data ends (e.g. the rollouts' metrics when the trainer has its
        batch, before the new weights let the next step's rollouts start), so that a row
        does not depend on how far the next step's work got meanwhile."""
        if self._cut is not None and self._cut[0] != prefix:
            raise ValueError(f"one cut prefix per row: {self._cut[0]!r} is cut, not {prefix!r}")
        moved = {k: self._pending.pop(k) for k in list(self._pending) if k.startswith(prefix)}
        if self._cut is not None:  # cut twice before the row: both shares are this row's
            for k, v in self._cut[1].items():
                moved[k] = v + moved.get(k, [])
        self._cut = (prefix, moved)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Write ``metrics`` as a row of its own for ``step`` (an evaluation, a summary)."""
        self.history.append({"step": step, **metrics})
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
        anything recorded with ``record_metric`` in this process; returns the row."""
        out = dict(metrics)
        pending, self._pending = self._pending, {}
        if self._cut is not None:  # the cut keys' later values wait for the next row
            prefix, before = self._cut
            self._pending = {k: v for k, v in pending.items() if k.startswith(prefix)}
            pending = {k: v for k, v in pending.items() if not k.startswith(prefix)} | before
            self._cut = None
        rewards = {k: v for k, v in pending.items() if k.startswith(M.REWARD)}
        alerts = [
            self.alerts.check(step, rewards, self.episodes.pending()),
            self.truncation.check(step, pending.get(M.TRUNCATED, [])),
        ]
        for alert in filter(None, alerts):  # printed above the progress bar, shown by forge top
            tqdm.write(f"[warning] {alert}", file=sys.stdout)
            self.status.alert(step, alert)
        for key, values in pending.items():
            if values:
                out[key] = statistics.fmean(values)
        out.update(merge_states([get_collector().flush(), *self._remote]))
        self._remote = []
        out[M.ELAPSED_S] = time.perf_counter() - self._t
        self.record(step, out)
        self.status.step(step, out)
        self.episodes.write(step)
        return out

    def close(self) -> None:
        for b in self.backends:
            b.close()


def progress(steps: Iterable, desc: str) -> tqdm:
    """A run's progress bar on stdout (steps, rate, and the postfix the loop sets)."""
    return tqdm(steps, desc=desc, file=sys.stdout, dynamic_ncols=True)


def progress_fields(row: dict[str, float], train_metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's postfix after a step: the rollouts' mean reward where rewards were
    scored, the teacher's KL where a teacher scored them (pure distillation has no reward to
    show, and a ``reward=0.000`` there would read as a run that cannot learn), and the loss."""
    shown = {}
    if M.REWARD in row or M.TEACHER_KL not in row:
        shown["reward"] = f"{row.get(M.REWARD, 0):.3f}"
    if M.TEACHER_KL in row:
        shown["teacher_kl"] = f"{row[M.TEACHER_KL]:.3f}"
    return {**shown, "loss": f"{train_metrics['loss']:.4f}"}


def step_row(
    train_metrics: dict[str, float], wait_s: float, train_s: float, sync_s: float
) -> dict[str, float]:
    """A training step's row: the trainer's metrics (``train/<key>``), its tokens per second
    and where the step's time went (waiting for episodes, training, the weight push)."""
    return {
        **{M.train(k): v for k, v in train_metrics.items()},
        M.TOKENS_PER_S: train_metrics.get("tokens", 0.0) / max(train_s, 1e-9),
        M.WAIT_BATCH_S: wait_s,
        M.TRAIN_S: train_s,
        M.WEIGHT_SYNC_S: sync_s,
        M.STEP_S: wait_s + train_s + sync_s,
    }
