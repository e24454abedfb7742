"""The host thread budget (controller.threads) in one process: the whole share alone, and
the switch that turns it off (shares across real processes:
tests/integration/components/test_thread_budget.py)."""

from __future__ import annotations

import os

import pytest
import torch

from controller.threads import ThreadBudget


@pytest.fixture
def table(tmp_path):
    return str(tmp_path / "threads")


def test_alone_a_process_gets_every_core_and_sets_torch_threads(table):
    b = ThreadBudget(path=table, cores=4, measure_load=False)
    before = torch.get_num_threads()
    try:
        with b.compute() as n:
            assert n == 4 and torch.get_num_threads() == 4
            assert b.busy_pids() == [os.getpid()]
        assert b.busy_pids() == []
    finally:
        torch.set_num_threads(before)
        b.close()


def test_disabled_budget_leaves_torch_threads_alone(table, monkeypatch):
    monkeypatch.setenv("FORGE_THREAD_BUDGET", "0")
    b = ThreadBudget(path=table, cores=4)
    before = torch.get_num_threads()
    with b.compute() as n:
        assert n == before == torch.get_num_threads()
