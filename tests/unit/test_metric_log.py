"""``MetricLog``: per-step rows, and ``cut`` (where a step's rollout metrics end)."""

from __future__ import annotations

import pytest

from forge.observability import get_collector
from forge.observability.names import M
from forge.run.metric_log import MetricLog


@pytest.fixture(autouse=True)
def _no_metrics_of_other_tests():
    """A row also holds this process's collector, where earlier tests may have recorded."""
    get_collector().flush()


def test_a_row_holds_the_means_of_what_was_added_since_the_last(tmp_path):
    log = MetricLog(tmp_path, [])
    log.add(M.REWARD, [0.0, 1.0])
    log.add("train/x", [3.0])
    row = log.step(1, {"a": 1.0})
    assert {k: v for k, v in row.items() if k != M.ELAPSED_S} == {
        "a": 1.0,
        M.REWARD: 0.5,
        "train/x": 3.0,
    }
    assert M.REWARD not in log.step(2, {})


def test_values_added_after_a_cut_go_to_the_row_after(tmp_path):
    log = MetricLog(tmp_path, [])
    log.add(M.REWARD, [1.0, 1.0])
    log.add("rollout/filtered_groups", [0.0])
    log.cut("rollout/")
    log.add(M.REWARD, [0.0])  # the next step's rollouts, already under way
    log.add("weights/push_s", [2.0])  # not cut: this row's
    row = log.step(1, {})
    assert row[M.REWARD] == 1.0 and row["rollout/filtered_groups"] == 0.0
    assert row["weights/push_s"] == 2.0
    log.add(M.REWARD, [0.0, 0.0, 0.0])
    row = log.step(2, {})
    assert row[M.REWARD] == 0.0 and "rollout/filtered_groups" not in row
    assert "weights/push_s" not in row


def test_two_cuts_before_a_row_keep_both_shares_and_one_prefix(tmp_path):
    log = MetricLog(tmp_path, [])
    log.add(M.REWARD, [1.0])
    log.cut("rollout/")
    log.add(M.REWARD, [0.0])
    log.cut("rollout/")
    log.add(M.REWARD, [5.0])
    with pytest.raises(ValueError, match="one cut prefix per row"):
        log.cut("train/")
    assert log.step(1, {})[M.REWARD] == 0.5
    assert log.step(2, {})[M.REWARD] == 5.0
