"""Versioned weights across real processes: another process pulls the same bytes, leased
views are read-only in the reader, recycling never mixes versions under concurrent readers,
and the torch.distributed bucketed broadcast over a real 2-process gloo group."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

from forge.weights import SharedMemoryTransport
from tests.helpers import REPO
from tests.unit.test_weights import assert_same, mixed_state_dict


@pytest.fixture
def prefix():
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def test_shm_pull_from_another_process_sees_same_bytes(prefix, tmp_path):
    transport = SharedMemoryTransport(prefix)
    sd = mixed_state_dict(seed=4)
    handle = transport.push(sd, version=5)
    (tmp_path / "handle.pkl").write_bytes(pickle.dumps(handle))
    code = textwrap.dedent(
        f"""
        import pickle, sys, torch
        from forge.weights import SharedMemoryTransport, pull_handle
        handle = pickle.load(open({str(tmp_path / "handle.pkl")!r}, "rb"))
        by_handle = pull_handle(handle)
        by_version = SharedMemoryTransport({prefix!r}).pull(5)
        torch.save({{"by_handle": by_handle, "by_version": by_version}}, {str(tmp_path / "out.pt")!r})
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = torch.load(tmp_path / "out.pt")
    assert_same(out["by_handle"], sd)
    assert_same(out["by_version"], sd)
    transport.close()


def test_shm_lease_views_are_read_only(prefix, tmp_path):
    transport = SharedMemoryTransport(prefix)
    h = transport.push({"w": torch.ones(8)}, version=1)
    script = textwrap.dedent(
        f"""
        from forge.weights.shm import lease_shm_file
        views, lease = lease_shm_file({h.location!r}, 1)
        print(float(views["w"].sum()), flush=True)
        views["w"].add_(1)  # the mapping is read-only: the kernel refuses the write
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.stdout.strip() == "8.0"
    assert out.returncode == -11, out.stderr[-2000:]  # SIGSEGV, and the file is untouched
    assert transport.pull(1)["w"].eq(1.0).all()
    transport.close()


_RECYCLE_READER = """
import sys, time, torch
from forge.weights import SharedMemoryTransport
transport = SharedMemoryTransport({prefix!r})
ok = gone = 0
deadline = time.monotonic() + {seconds}
while time.monotonic() < deadline:
    versions = transport.versions()
    if not versions:
        continue
    try:
        sd = transport.pull(versions[-1])
    except FileNotFoundError:
        gone += 1
        continue
    for name, t in sd.items():
        assert bool((t == versions[-1]).all()), (name, versions[-1], t.min(), t.max())
    ok += 1
print("OK", ok, gone)
"""


_BROADCAST_WORKER = """
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
from tests.unit.test_weights import assert_same, mixed_state_dict
from forge.weights import broadcast_state_dict

rank = int(sys.argv[1])
dist.init_process_group(
    "gloo", init_method={init!r}, rank=rank, world_size=2, timeout=timedelta(seconds=60)
)
expected = mixed_state_dict(seed=9)
if rank == 0:
    assert broadcast_state_dict(expected, src=0, bucket_mb=0.0002) is expected
    broadcast_state_dict(expected, src=0, bucket_mb=64)
else:
    fresh = broadcast_state_dict(None, src=0, bucket_mb=0.0002)
    assert_same(fresh, expected)
    into = {{name: torch.zeros_like(t) for name, t in expected.items()}}
    assert broadcast_state_dict(None, src=0, bucket_mb=64, into=into, timeout=30) is into
    assert_same(into, expected)
    print("RECEIVED OK")
dist.destroy_process_group()
"""


def test_broadcast_state_dict_over_two_process_gloo_group(tmp_path):
    code = _BROADCAST_WORKER.format(init=f"file://{tmp_path / 'pg_init'}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=90))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    assert "RECEIVED OK" in outputs[1][0]
