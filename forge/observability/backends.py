"""Where reduced metrics go: console, ``metrics.jsonl``, TensorBoard, Weights & Biases.

Each backend receives ``log(step, {key: value})`` once per training step with the values
already reduced across processes (see :func:`forge.observability.merge_states`), and
``close()`` at the end of the run. :func:`build_backends` turns the config's list of names
into instances. TensorBoard and wandb are optional extras, imported only when their backend
is built.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "ConsoleBackend",
    "JsonlBackend",
    "MetricBackend",
    "TensorBoardBackend",
    "WandbBackend",
    "build_backends",
]


class MetricBackend:
    """Base class: a sink for one value per metric key per step."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` for training step ``step``."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources. Safe to call more than once."""


class ConsoleBackend(MetricBackend):
    """One compact line per step, keys sorted: ``step 12 | loss=0.4213 reward/mean=0.75``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        # None means "sys.stdout at log time", so pytest's capsys and redirection still work.
        self._stream = stream

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        parts = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
        stream = self._stream or sys.stdout
        print(f"step {step} | {parts}", file=stream, flush=True)


class JsonlBackend(MetricBackend):
    """Appends ``{"step": s, "time": t, **metrics}`` as one JSON line to ``run_dir/metrics.jsonl``.

    ``time`` is Unix seconds. Each line is flushed at once, so a crashed run keeps its
    metrics up to the last completed step.
    """

    def __init__(self, run_dir: str | os.PathLike[str], filename: str = "metrics.jsonl") -> None:
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._file is None:
            raise ValueError(f"JsonlBackend for {self.path} is closed; cannot log step {step}")
        record = {"step": step, "time": time.time(), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_jsonl(path: str | os.PathLike[str]) -> list[dict]:
    """The complete records of a JSON-lines file that a live run may be appending to.

    A line longer than the writer's buffer reaches the file in several writes, so a reader
    can see its first part only: a last line without its newline is left for the next read.
    A missing file has no records.
    """
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class TensorBoardBackend(MetricBackend):
    """Scalars in ``run_dir/tensorboard`` via ``torch.utils.tensorboard``."""

    def __init__(self, run_dir: str | os.PathLike[str], subdir: str = "tensorboard") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "the 'tensorboard' metric backend needs the tensorboard package: "
                "pip install forge[tensorboard]"
            ) from e
        self.log_dir = Path(run_dir) / subdir
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # A closed SummaryWriter would quietly open a second event file: refuse instead.
        if self._writer is None:
            raise ValueError(
                f"TensorBoardBackend for {self.log_dir} is closed; cannot log step {step}"
            )
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbBackend(MetricBackend):
    """A Weights & Biases run; ``mode="offline"`` writes under ``run_dir`` without a login.

    ``mode=None`` leaves the choice to wandb (``WANDB_MODE``, else online). Each backend owns
    its own run, also when several are open in one process. wandb starts a service process
    (``wandb-core``) on the first run and keeps it until the process exits.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str = "forge",
        name: str | None = None,
        mode: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "the 'wandb' metric backend needs the wandb package: pip install forge[wandb]"
            ) from e
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run: Any = wandb.init(
            project=project,
            name=name,
            mode=mode,
            dir=str(run_dir),
            config=dict(config) if config else None,
            # By default a second init() in a process returns the run already open: a second
            # backend would log into (and finish) the first one's run.
            reinit="create_new",
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._run is None:
            raise ValueError(f"WandbBackend for {self.run_dir} is closed; cannot log step {step}")
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def _registry(options: Mapping[str, Any]) -> dict[str, Callable[[Path], MetricBackend]]:
    return {
        "console": lambda run_dir: ConsoleBackend(),
        "jsonl": lambda run_dir: JsonlBackend(run_dir),
        "tensorboard": lambda run_dir: TensorBoardBackend(run_dir),
        "wandb": lambda run_dir: WandbBackend(run_dir, **options),
    }


def build_backends(
    names: Sequence[str],
    run_dir: str | os.PathLike[str],
    *,
    wandb_project: str = "forge",
    wandb_mode: str | None = None,
    run_name: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[MetricBackend]:
    """Instantiate the backends called ``names`` (``console``, ``jsonl``, ``tensorboard``,
    ``wandb``), writing under ``run_dir``.

    Every name is checked before any backend is built, so a typo leaves no half-opened
    files behind. ``config`` (the resolved run config as a dict) is attached to wandb runs.
    """
    options = {"project": wandb_project, "mode": wandb_mode, "name": run_name, "config": config}
    registry = _registry(options)
    for name in names:
        if name not in registry:
            raise ValueError(f"unknown metric backend {name!r}; choose one of {sorted(registry)}")
    return [registry[name](Path(run_dir)) for name in names]
