"""forge.observability: per-process partial states, cross-process merge, backends (wandb,
which runs its own ``wandb-core`` process: tests/integration/components/test_wandb_backend.py)."""

from __future__ import annotations

import io
import json
import math
import pickle
import time

import numpy as np
import pytest

from forge.observability import (
    ConsoleBackend,
    JsonlBackend,
    MeanState,
    MetricCollector,
    Reduce,
    StdState,
    TensorBoardBackend,
    build_backends,
    get_collector,
    merge_states,
    read_jsonl,
    record_metric,
    reset_collector,
    timer,
)


@pytest.fixture(autouse=True)
def fresh_collector():
    reset_collector()
    yield
    reset_collector()


# Uneven splits on purpose: a mean of per-process means would be wrong here.
PROCESS_VALUES = [
    [1.0, 2.0, 3.0, 4.0, 5.0],
    [10.0],
    [-2.5, 7.25, 0.0],
    [1e3 + 0.5, 1e3 - 0.5],
]
NUMPY_REDUCE = {
    Reduce.MEAN: np.mean,
    Reduce.SUM: np.sum,
    Reduce.MAX: np.max,
    Reduce.MIN: np.min,
    Reduce.STD: np.std,  # population std, ddof=0
}


@pytest.mark.parametrize("reduce", list(Reduce))
def test_merge_across_processes_matches_numpy(reduce):
    flushed = []
    for values in PROCESS_VALUES:
        collector = MetricCollector()  # one per simulated process
        for v in values:
            collector.record("m", v, reduce)
        # States travel between processes by pickle; send them through it for real.
        flushed.append(pickle.loads(pickle.dumps(collector.flush())))
    expected = NUMPY_REDUCE[reduce](np.concatenate(PROCESS_VALUES))
    assert merge_states(flushed)["m"] == pytest.approx(float(expected), rel=1e-12)


def test_mean_is_weighted_by_count_not_by_process():
    a, b = MetricCollector(), MetricCollector()
    for v in (0.0, 0.0, 0.0):
        a.record("r", v)
    b.record("r", 4.0)
    # (0 + 0 + 0 + 4) / 4 = 1.0; the mean of process means would be 2.0.
    assert merge_states([a.flush(), b.flush()]) == {"r": 1.0}


def test_std_is_stable_for_large_offsets():
    values = 1e9 + np.array([0.0, 1.0, 2.0, 3.0])  # std = sqrt(1.25)
    collectors = [MetricCollector(), MetricCollector()]
    for i, v in enumerate(values):
        collectors[i % 2].record("t", float(v), Reduce.STD)
    result = merge_states([c.flush() for c in collectors])["t"]
    assert result == pytest.approx(math.sqrt(1.25), rel=1e-9)


def test_partial_states_are_small_and_exact():
    c = MetricCollector()
    for v in (1.0, 2.0, 6.0):
        c.record("mean", v)
        c.record("std", v, "std")
    states = c.flush()
    assert states["mean"] == MeanState(total=9.0, count=3)
    # mean 3, squared deviations 4 + 1 + 9 = 14.
    assert states["std"] == StdState(count=3, mean=3.0, m2=14.0)


def test_flush_returns_and_clears():
    c = MetricCollector()
    c.record("a", 1.0, Reduce.SUM)
    c.record("a", 2.0, Reduce.SUM)
    assert merge_states([c.flush()]) == {"a": 3.0}
    assert c.flush() == {}
    c.record("a", 5.0, Reduce.SUM)
    assert merge_states([c.flush()]) == {"a": 5.0}


def test_merge_does_not_mutate_inputs():
    c = MetricCollector()
    c.record("a", 1.0)
    states = c.flush()
    merge_states([states, states])
    assert states["a"] == MeanState(total=1.0, count=1)


def test_conflicting_reduce_is_an_error():
    c = MetricCollector()
    c.record("loss", 1.0, Reduce.MEAN)
    with pytest.raises(
        ValueError, match=r"'loss' was recorded with Reduce.MEAN and now with Reduce.MAX"
    ):
        c.record("loss", 2.0, Reduce.MAX)
    a, b = MetricCollector(), MetricCollector()
    a.record("x", 1.0, Reduce.SUM)
    b.record("x", 1.0, Reduce.MIN)
    with pytest.raises(
        ValueError, match=r"'x' was recorded with Reduce.SUM and now with Reduce.MIN"
    ):
        merge_states([a.flush(), b.flush()])


def test_non_numeric_value_is_a_type_error():
    with pytest.raises(TypeError, match="metric 'name': value must be a number, got 'abc'"):
        MetricCollector().record("name", "abc")


def test_record_metric_uses_the_process_collector_and_reset_clears_it():
    record_metric("a", 2.0)
    record_metric("a", 4.0)
    assert merge_states([get_collector().flush()]) == {"a": 3.0}
    record_metric("b", 1.0)
    reset_collector()
    assert get_collector().flush() == {}


def test_record_metric_accepts_zero_dim_tensors():
    torch = pytest.importorskip("torch")
    record_metric("loss", torch.tensor(0.25))
    assert merge_states([get_collector().flush()]) == {"loss": 0.25}


def test_timer_records_elapsed_seconds_even_on_error():
    with timer("time/step"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), timer("time/step"):
        time.sleep(0.02)
        raise RuntimeError("boom")
    states = get_collector().flush()
    assert states["time/step"].count == 2
    assert 0.02 <= merge_states([states])["time/step"] < 1.0


def test_console_backend_prints_one_sorted_line():
    stream = io.StringIO()
    ConsoleBackend(stream).log(3, {"loss": 0.123456, "a/reward": 2.0, "lr": 1e-5})
    assert stream.getvalue() == "step 3 | a/reward=2 loss=0.1235 lr=1e-05\n"


def test_jsonl_backend_appends_parseable_lines(tmp_path):
    before = time.time()
    backend = JsonlBackend(tmp_path / "run")
    backend.log(0, {"loss": 1.5})
    backend.log(1, {"loss": 0.5, "reward": 0.25})
    backend.close()
    backend.close()  # idempotent
    # A resumed run appends to the same file.
    again = JsonlBackend(tmp_path / "run")
    again.log(2, {"loss": 0.0})
    again.close()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1]["loss"] == 0.5 and records[1]["reward"] == 0.25
    assert all(before <= r["time"] <= time.time() for r in records)
    with pytest.raises(ValueError, match="is closed"):
        again.log(3, {"loss": 0.0})


def test_read_jsonl_leaves_a_line_still_being_written(tmp_path):
    # A record longer than the writer's buffer reaches the file in several writes.
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    whole = json.dumps({"step": 0, "k": "x" * 10_000}) + "\n"
    path.write_text(whole + '{"step": 1, "k": "xx')
    assert [r["step"] for r in read_jsonl(path)] == [0]
    path.write_text(whole + '{"step": 1}\n')
    assert [r["step"] for r in read_jsonl(path)] == [0, 1]


def test_build_backends(tmp_path, capsys):
    backends = build_backends(["console", "jsonl"], tmp_path)
    assert [type(b) for b in backends] == [ConsoleBackend, JsonlBackend]
    for b in backends:
        b.log(5, {"x": 1.0})
        b.close()
    assert capsys.readouterr().out == "step 5 | x=1\n"
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["x"] == 1.0


def test_build_backends_unknown_name_builds_nothing(tmp_path):
    with pytest.raises(ValueError) as info:
        build_backends(["jsonl", "tensorbored"], tmp_path / "run")
    assert str(info.value) == (
        "unknown metric backend 'tensorbored'; "
        "choose one of ['console', 'jsonl', 'tensorboard', 'wandb']"
    )
    assert not (tmp_path / "run").exists()


def test_tensorboard_backend_writes_events_or_names_the_extra(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install forge\[tensorboard\]"):
            TensorBoardBackend(tmp_path)
        return
    backend = TensorBoardBackend(tmp_path)
    backend.log(1, {"loss": 0.5})
    backend.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
