"""A run's live status for ``forge top``: the controller's snapshot plus the RL loop's fields.

``forge run`` wraps every app in ``run_status(run_dir)``: ``<run_dir>/status.json`` is
rewritten about once a second (meshes, services, replicas: ``controller/status.py``) and
ends marked ``finished``, ``crashed`` (with the error) or ``interrupted``. An RL loop adds
its fields through a ``StepStatus`` (``forge.run.MetricLog`` holds one and
feeds it every step's metrics), published under ``extra["rl"]``::

    {"stage": "grpo", "step": 45, "steps_total": 500, "steps_per_s": 0.8,
     "trainer_version": 45, "generator_versions": {"0": 45, "1": 44},
     "rewards": {"rollout/reward": 0.53, ...}, "reward_history": [...last 60...],
     "busy": {"trainer": 0.41, "generator": 0.88, ...},
     "buffer": {"size": 96, "policy_age_mean": 0.5, "policy_age_max": 1, "evicted_stale": 3},
     "train": {"train/loss": ..., "train/tokens_per_s": ..., "time/step_s": ...},
     "memory": {"generator": {"generate": 812.0, "asleep": 96.0, ...}, "trainer": {...}},
     "eval": {"step": 0, "eval/heldout_accuracy": 0.375}, "updated_at": t}

``memory`` (time-sliced colocation, ``forge.run.colocate``): MiB per role and phase end, GPU
allocated where a GPU is used, else host RSS.

Publishing costs a dict copy per step: no process is asked for anything extra.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from controller.status import StatusWriter, set_status_field
from forge.observability.names import M

__all__ = ["STATUS_FILE", "StepStatus", "run_status"]

STATUS_FILE = "status.json"
_BUFFER_KEYS = {
    M.BUFFER_SIZE: "size",
    M.SAMPLED_POLICY_AGE_MEAN: "policy_age_mean",
    M.SAMPLED_POLICY_AGE_MAX: "policy_age_max",
    M.EVICTED_STALE_TOTAL: "evicted_stale",
}
_TRAIN_KEYS = (
    M.LOSS,
    M.SFT_LOSS,
    M.TOKENS_PER_S,
    M.STEP_S,
    M.WAIT_BATCH_S,
    M.TRAIN_S,
    M.WEIGHT_SYNC_S,
)
_HISTORY = 60
_RATE_WINDOW = 20


@contextlib.contextmanager
def run_status(run_dir: str | Path, interval_s: float = 1.0, **info: Any) -> Iterator[StatusWriter]:
    """Keep ``<run_dir>/status.json`` current while the block runs; mark it ``finished``,
    ``crashed`` (with the error and traceback) or ``interrupted`` (Ctrl-C, SIGTERM) at the
    end. The final snapshot is taken before the caller stops the run's processes, so it
    shows the replicas as they were when the run ended."""
    writer = StatusWriter(Path(run_dir) / STATUS_FILE, interval_s, info).start()
    try:
        yield writer
    except (KeyboardInterrupt, asyncio.CancelledError, SystemExit) as e:
        writer.finish("interrupted", f"{type(e).__name__}: stopped before the end")
        raise
    except BaseException as e:
        writer.finish("crashed", e)
        raise
    writer.finish("finished")


def _number(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class StepStatus:
    """An RL loop's fields in the status snapshot. ``step(n, metrics)`` once per step with
    that step's reduced metrics; ``eval(n, metrics)`` after an evaluation;
    ``served(versions)`` with ``{replica: weight version}`` after a weight push."""

    def __init__(self, stage: str, steps_total: int | None = None):
        self.fields: dict[str, Any] = {
            "stage": stage,
            "step": 0,
            "steps_total": steps_total,
            "steps_per_s": None,
            "trainer_version": None,
            "generator_versions": {},
            "rewards": {},
            "reward_history": [],
            "busy": {},
            "buffer": {},
            "train": {},
            "memory": {},
            "eval": None,
            "alerts": [],
        }
        self._times: collections.deque[tuple[float, int]] = collections.deque(maxlen=_RATE_WINDOW)
        self._history: collections.deque[float] = collections.deque(maxlen=_HISTORY)
        self._publish()  # the stage shows at once (e.g. grpo replacing sft), before step 1

    def step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record step ``step`` (the trainer's weight version after it) and its metrics."""
        now = time.time()
        self._times.append((now, step))
        f = self.fields
        f["step"] = f["trainer_version"] = step
        if len(self._times) > 1:
            (t0, s0), (t1, s1) = self._times[0], self._times[-1]
            f["steps_per_s"] = (s1 - s0) / max(t1 - t0, 1e-9)
        nums = {k: n for k, v in metrics.items() if (n := _number(v)) is not None}
        if M.REWARD in nums:
            self._history.append(nums[M.REWARD])
            f["reward_history"] = list(self._history)
        # Actors' metrics arrive off the critical path: a step's row may lack some of them.
        # Keep the last values shown rather than blanking the rows until the next flush.
        groups = {
            "rewards": {k: v for k, v in nums.items() if k.startswith(M.REWARD)},
            "busy": {
                k[: -len(M.BUSY_SUFFIX)]: v for k, v in nums.items() if k.endswith(M.BUSY_SUFFIX)
            },
            "buffer": {name: nums[k] for k, name in _BUFFER_KEYS.items() if k in nums},
            "train": {k: nums[k] for k in _TRAIN_KEYS if k in nums},
            "memory": _memory(nums),
        }
        for key, values in groups.items():
            if values:
                f[key] = values
        self.eval(step, metrics)
        self._publish()

    def eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Keep the ``eval/*`` values of ``metrics`` as the last evaluation (if any)."""
        found = {
            k: n
            for k, v in metrics.items()
            if k.startswith("eval/") and (n := _number(v)) is not None
        }
        if found:
            self.fields["eval"] = {"step": step, **found}
            self._publish()

    def alert(self, step: int, message: str) -> None:
        """A warning ``forge top`` shows (the last few are kept)."""
        self.fields["alerts"] = [*self.fields["alerts"][-2:], f"step {step}: {message}"]
        self._publish()

    def served(self, versions: Mapping[int, int]) -> None:
        """The weight version each generator replica now serves (``{replica index: v}``,
        e.g. from ``update_weights.fanout_by_replica``). Replicas missing keep their last."""
        new = {str(i): int(v) for i, v in versions.items()}
        # a new dict, never an update in place: the writer thread may be serialising the old
        self.fields["generator_versions"] = {**self.fields["generator_versions"], **new}
        self._publish()

    def _publish(self) -> None:
        # Every nested value is replaced, never mutated, so a shallow copy is a safe snapshot.
        self.fields["updated_at"] = time.time()
        set_status_field("rl", dict(self.fields))


def _memory(nums: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """``memory/<role>/<phase>/<kind>_mb`` -> ``{role: {phase: MiB}}``: GPU allocated where
    a GPU is used, else host RSS."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("rss_mb", "gpu_allocated_mb"):  # the GPU figure wins where there is one
        for key, v in nums.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "memory" and parts[3] == kind:
                out.setdefault(parts[1], {})[parts[2]] = v
    return out
