"""Run checkpoints for ``forge run --resume``: the trainer (model, optimizer, schedule, RNG),
the replay buffer and the data source's position, published atomically.

    ckpt = Checkpointer(run_dir, every=10)
    version = await ckpt.restore(trainer, buffer, data) if resume else 0
    ...
    await ckpt.maybe_save(version, trainer, buffer, data)   # every ``every`` steps

Layout: ``<run_dir>/checkpoints/step_NNNNNN/{trainer/, state.pt}`` and ``latest`` (JSON
naming the last complete one). ``state.pt`` holds only tensors and plain Python data and is
loaded with ``torch.load(weights_only=True)``: resuming a copied run directory runs no code
from its files.

A checkpoint is written under ``.tmp_step_N``, flushed to disk (every file and directory
``fsync``-ed), renamed to ``step_N``, and only then named by ``latest`` (itself replaced
atomically): a save that fails at any point (a full disk, a crash) leaves the previous
checkpoint published and loadable, and removes what it wrote. After each save only the
newest ``keep_last`` checkpoints stay.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge.durable import publish_dir, write_file

if TYPE_CHECKING:
    from forge.actors.dataset import DatasetActor
    from forge.actors.replay_buffer import ReplayBuffer
    from forge.actors.trainer import Trainer

__all__ = ["Checkpointer", "plain"]

_PLAIN = (str, int, float, bool, type(None))


def plain(obj: Any, where: str) -> Any:
    """``obj`` as what ``torch.load(weights_only=True)`` reads back: dicts, lists, tuples,
    strings, numbers, ``None`` and tensors; numpy scalars and arrays are converted. Anything
    else is a ``TypeError`` naming where it is (at save time, not at resume)."""
    import numpy as np
    import torch

    if isinstance(obj, (*_PLAIN, torch.Tensor)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy()) if obj.dtype != object else plain(obj.tolist(), where)
    if isinstance(obj, dict):
        return {plain(k, f"{where} key"): plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(type(v) in _PLAIN for v in obj):  # token ids, logprobs: the bulk, kept as is
            return obj
        out = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else tuple(out)
    raise TypeError(
        f"checkpoint: {where} is a {type(obj).__module__}.{type(obj).__qualname__}; a run "
        "checkpoint holds only plain data and tensors (a state_dict must return those)"
    )


def _step_of(path: Path) -> int | None:
    """N of a ``step_N`` (or ``.tmp_step_N``) directory; ``None``: not a name Forge writes."""
    digits = path.name.removeprefix(".tmp_").removeprefix("step_")
    return int(digits) if digits.isdigit() else None


class Checkpointer:
    """Every ``every`` steps: trainer (model, optimizer, schedule, RNG), replay buffer and
    dataset position, written to ``<run_dir>/checkpoints/step_N``, flushed to disk, then
    published atomically by renaming and pointing ``latest`` at it; the newest ``keep_last``
    are kept (0: all)."""

    def __init__(self, run_dir: Path, every: int, keep_last: int = 2):
        if keep_last < 0:
            raise ValueError(f"checkpoint keep_last must be >= 0 (0: keep all), got {keep_last}")
        self.root = Path(run_dir).absolute() / "checkpoints"  # sent to actors elsewhere
        self.every = every
        self.keep_last = keep_last

    async def maybe_save(
        self, step: int, trainer: Trainer, buffer: ReplayBuffer, data: DatasetActor
    ) -> Path | None:
        if not self.every or step % self.every:
            return None
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            await trainer.save.call(str(tmp / "trainer"))
            state = {
                "step": step,
                "buffer": await buffer.state_dict.call_one(),
                "data": await data.state_dict.call_one(),
            }
            import torch

            # Plain data and tensors only: restore() unpickles nothing else (weights_only).
            torch.save(plain(state, "state"), tmp / "state.pt")
            publish_dir(tmp, final)
            write_file(self.root / "latest", json.dumps({"step": step, "dir": final.name}).encode())
        except BaseException:
            # A failed save (a full disk) frees what it wrote; ``latest`` still names the
            # previous checkpoint, untouched.
            shutil.rmtree(tmp, ignore_errors=True)
            if self.latest() != final:
                shutil.rmtree(final, ignore_errors=True)
                previous = self.latest()
                kept = f"the previous one, {previous.name}, is intact" if previous else "none"
                note = f"[forge] checkpoint of step {step} not saved in {self.root}; kept: {kept}"
                print(note, file=sys.stderr, flush=True)
            raise
        self._prune()
        return final

    def _prune(self) -> None:
        """Remove all but the newest ``keep_last`` published checkpoints, and what saves that
        did not finish left behind (a crash, a kill)."""
        latest, last = self.latest(), self.latest_step()
        if latest is None or last is None:
            return
        steps = {p: _step_of(p) for p in self.root.glob("step_*")}
        published = sorted((n, p) for p, n in steps.items() if n is not None and n <= last)
        published = [p for _, p in published]
        keep = set(published[-self.keep_last :] if self.keep_last else published) | {latest}
        for p in [*self.root.glob("step_*"), *self.root.glob(".tmp_step_*")]:
            if p not in keep and _step_of(p) is not None:
                shutil.rmtree(p, ignore_errors=True)

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

    async def restore(self, trainer: Trainer, buffer: ReplayBuffer, data: DatasetActor) -> int:
        """Load the latest checkpoint into the actors; returns its step (0 if none)."""
        path = self.latest()
        if path is None:
            return 0
        from forge.training.trainer_checkpoint import safe_load

        state = safe_load(path / "state.pt")
        await trainer.load.call(str(path / "trainer"))
        await buffer.load_state_dict.call_one(state["buffer"])
        await data.load_state_dict.call_one(state["data"])
        print(f"[forge] resumed from {path} (step {state['step']})", flush=True)
        return int(state["step"])
