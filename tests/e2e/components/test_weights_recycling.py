"""Shared-memory recycling under two concurrent reader processes never mixes versions (10-18 s:
the readers read for 2 s each; tests/integration/components/test_weights_processes.py has the
rest)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import torch

from forge.weights import SharedMemoryTransport, WeightStore
from tests.helpers import REPO
from tests.integration.components.test_weights_processes import _RECYCLE_READER


@pytest.fixture
def prefix():
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.mark.timeout(120)
def test_shm_recycling_under_concurrent_readers_never_mixes_versions(prefix):
    code = _RECYCLE_READER.format(prefix=prefix, seconds=2.0)
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    store = WeightStore(SharedMemoryTransport(prefix, spares=1), keep_last=1)
    version = 0
    try:
        while any(r.poll() is None for r in readers):
            version += 1
            store.push({f"t{i}": torch.full((1 << 20,), float(version)) for i in range(8)}, version)
        outputs = [r.communicate(timeout=60) for r in readers]
    finally:
        for r in readers:
            if r.poll() is None:
                r.kill()
        store.close()
    for r, (out, err) in zip(readers, outputs):
        assert r.returncode == 0, err
        assert out.startswith("OK") and int(out.split()[1]) > 0, out
    assert version > 10
