"""Fixtures of the multihost tests: one user of the simulated hosts at a time (``_lock``),
and ``monarch_hosts`` (Monarch's worker loop in two network namespaces). The Ray cluster of
shared-nothing hosts is ``tests/multihost/test_ray_cluster.py``'s ``cluster`` fixture.

Tests here need root and ``ip netns`` and skip with the reason otherwise.
"""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from tests.helpers import pid_alive, wait_dead
from tests.multihost import netns

LOCK = "/tmp/forge-netns.lock"  # one user of the forgeh* namespaces at a time
LOCK_WAIT_S = 600.0


def _lock() -> int:
    """Take the simulated hosts (close the fd to give them back); another process waits for
    them, up to ``LOCK_WAIT_S``."""
    fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.fail(f"{LOCK} stayed locked for {LOCK_WAIT_S:.0f} s")
            time.sleep(0.2)


def only_agents_left(hosts: list[netns.NetnsHost], timeout: float = 10.0) -> dict[str, list[int]]:
    """Wait until each live host runs nothing but its ``agent`` process (Monarch's worker
    loop); returns the extra pids per host."""
    deadline = time.monotonic() + timeout
    while True:
        extra = {
            h.ns: [p for p in netns.ns_pids(h.ns) if p != h.agent.pid and pid_alive(p)]
            for h in hosts
            if h.agent.poll() is None
        }
        if not any(extra.values()) or time.monotonic() > deadline:
            return {k: v for k, v in extra.items() if v}
        time.sleep(0.1)


@pytest.fixture
def monarch_hosts(tmp_path):
    """Two hosts running Monarch's worker loop (port 4444) instead of Forge agents."""
    why = netns.unavailable_reason()
    if why:
        pytest.skip(why)
    fd = _lock()
    hs: list[netns.NetnsHost] = []
    seen: set[int] = set()
    try:
        hs = netns.setup(2)
        for h in hs:
            netns.start_monarch_worker(h, tmp_path / f"monarch-{h.ns}.log")
        yield hs
        for h in hs:
            seen.update(netns.ns_pids(h.ns))
        leftover = only_agents_left(hs)
        assert not leftover, f"processes left beside Monarch's worker loops: {leftover}"
    finally:
        netns.teardown(hs)
        os.close(fd)
    alive = wait_dead(sorted(seen), 5.0)
    assert not alive, f"processes alive after the hosts were torn down: {alive}"
