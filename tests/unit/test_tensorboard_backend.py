"""TensorBoardBackend with the real tensorboard package: the scalars it writes read back.

CI installs the extra (`scripts/test.sh`); elsewhere this skips without `forge[tensorboard]`.
The writer is a thread, not a process, so this is a unit test.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard", reason="needs forge[tensorboard]")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from forge.observability import TensorBoardBackend, build_backends


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_read_back_per_step(tmp_path):
    [backend] = build_backends(["tensorboard"], tmp_path / "run")
    assert isinstance(backend, TensorBoardBackend)
    backend.log(1, {"loss": 0.5, "reward/mean": 0.25})
    backend.log(2, {"loss": 0.25, "reward/mean": 0.75, "eval/accuracy": 1})
    # Each log flushes: a reader sees step 2 before the run closes (`tensorboard --logdir`
    # on a live run, or a crashed one).
    assert _scalars(tmp_path / "run" / "tensorboard") == {
        "loss": [(1, 0.5), (2, 0.25)],
        "reward/mean": [(1, 0.25), (2, 0.75)],
        "eval/accuracy": [(2, 1.0)],
    }
    backend.close()
    backend.close()  # safe twice, like every backend
    assert len(list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_log_after_close_is_an_error(tmp_path):
    backend = TensorBoardBackend(tmp_path)
    backend.close()
    with pytest.raises(ValueError, match="is closed; cannot log step 3"):
        backend.log(3, {"loss": 1.0})
    assert _scalars(tmp_path / "tensorboard") == {}
