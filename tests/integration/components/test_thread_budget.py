"""The host thread budget (controller.threads) across real processes: busy processes
split the cores, a dead holder stops counting, and load from other processes shrinks the
share."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch

from controller.threads import ThreadBudget


def _hold_busy(path: str, cores: int, ready, release) -> None:
    b = ThreadBudget(path=path, cores=cores, measure_load=False)
    with b.compute():
        ready.set()
        release.wait(30)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.fixture
def table(tmp_path):
    return str(tmp_path / "threads")


def _start_holders(table: str, cores: int, n: int):
    ctx = mp.get_context("spawn")
    release = ctx.Event()
    procs, readies = [], []
    for _ in range(n):
        ready = ctx.Event()
        p = ctx.Process(target=_hold_busy, args=(table, cores, ready, release), daemon=True)
        p.start()
        procs.append(p)
        readies.append(ready)
    for r in readies:
        assert r.wait(60), "a holder process did not start"
    return procs, release


def test_busy_processes_split_the_cores_and_the_share_widens_when_they_finish(table):
    procs, release = _start_holders(table, 4, 2)
    b = ThreadBudget(path=table, cores=4, measure_load=False)
    before = torch.get_num_threads()
    try:
        assert sorted(b.busy_pids()) == sorted(p.pid for p in procs)
        with b.compute() as n:
            # 3 busy on 4 cores: 1 each, and the lowest pid takes the remainder
            assert n == (2 if os.getpid() < min(p.pid for p in procs) else 1)
            release.set()
            for p in procs:
                p.join(30)
            assert b.rebalance() == 4  # the neighbours are done: the freed cores come back
    finally:
        release.set()
        torch.set_num_threads(before)
        b.close()


def test_more_busy_processes_than_cores_get_one_thread_each(table):
    procs, release = _start_holders(table, 2, 3)
    b = ThreadBudget(path=table, cores=2, measure_load=False)
    try:
        assert b.share() == 1
    finally:
        release.set()
        for p in procs:
            p.join(30)
        b.close()


def test_a_holder_that_died_while_busy_stops_counting(table):
    procs, release = _start_holders(table, 4, 1)
    b = ThreadBudget(path=table, cores=4, measure_load=False)
    try:
        assert b.busy_pids() == [procs[0].pid]
        procs[0].kill()
        procs[0].join(30)
        assert b.busy_pids() == []  # its busy flag is still set, but its pid is gone
        assert b.share() == 4
    finally:  # (no release.set(): notifying a condition a killed process waited on hangs)
        if procs[0].is_alive():
            procs[0].kill()
        b.close()


def test_load_from_other_processes_shrinks_the_share(table):
    ctx = mp.get_context("spawn")
    spinner = ctx.Process(target=_spin, args=(4.0,), daemon=True)  # not a budget holder
    b = ThreadBudget(path=table, cores=os.cpu_count(), measure_load=True)
    try:
        b.share()  # first sample
        spinner.start()
        time.sleep(1.2)
        b.share()
        assert b._other_load >= 0.6, b._other_load  # the spinner's core (plus any other load)
        assert b.share() <= os.cpu_count() - 1
    finally:
        spinner.kill()
        spinner.join(10)
        b.close()
