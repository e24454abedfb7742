"""Versioned weights: shm and safetensors transports, the store's retention and errors, and the
torch.distributed bucketed broadcast (a real 2-process gloo group)."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

from forge.weights import (
    SafetensorsDirTransport,
    SharedMemoryTransport,
    WeightStore,
    WeightVersionError,
    build_weight_transport,
    plan_buckets,
    pull_handle,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHM = "/dev/shm"


def mixed_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Every dtype a model can hold, plus a non-contiguous, a 0-dim and an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(17, 8, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(9, 5, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(5, 9, generator=g).half(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(6, 4, generator=g).t(),
        "model.rotary.inv_freq": torch.randn(3, generator=g).double(),
        "step": torch.tensor(7),
        "token_counts": torch.randint(-5, 1000, (11,), generator=g, dtype=torch.int64),
        "small_ints": torch.randint(-100, 100, (4, 3), generator=g, dtype=torch.int8),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


@pytest.fixture
def prefix():
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def shm_files(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM) if n.startswith(f"forge-w-{prefix}-"))


def test_shm_round_trip_mixed_dtypes_fresh_tensors(prefix):
    transport = SharedMemoryTransport(prefix)
    sd = mixed_state_dict()
    handle = transport.push(sd, version=1)
    assert handle.manifest["model.layers.0.mlp.up_proj.weight"].dtype == "bfloat16"
    assert all(meta.offset % 64 == 0 for meta in handle.manifest.values())
    got = transport.pull(1)  # by version: manifest read from the file header
    assert_same(got, sd)
    assert got["model.layers.0.self_attn.q_proj.weight"].is_contiguous()
    got["model.embed_tokens.weight"].fill_(0)  # owned memory: does not write through to shm
    assert_same(transport.pull(handle), sd)
    transport.close()


def test_shm_pull_into_existing_tensors_without_allocation(prefix):
    transport = SharedMemoryTransport(prefix)
    sd = mixed_state_dict()
    transport.push(sd, version=3)
    into = {name: torch.zeros_like(t) for name, t in sd.items()}
    ptrs = {name: t.data_ptr() for name, t in into.items()}
    got = transport.pull(3, into=into)
    assert got is into
    assert {name: t.data_ptr() for name, t in into.items()} == ptrs
    assert_same(into, sd)

    wrong = dict(into, step=torch.zeros((), dtype=torch.int32))
    with pytest.raises(ValueError, match=r"parameter 'step' is int64\[\] but the destination is"):
        transport.pull(3, into=wrong)
    with pytest.raises(ValueError, match=r"has no parameter\(s\) \['lm_head.weight'\]"):
        transport.pull(3, into=dict(into, **{"lm_head.weight": torch.zeros(2)}))
    transport.close()


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
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = torch.load(tmp_path / "out.pt")
    assert_same(out["by_handle"], sd)
    assert_same(out["by_version"], sd)
    transport.close()


def test_store_retention_and_version_errors(prefix):
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    for version in range(1, 5):
        store.push({"w": torch.full((3,), float(version))}, version)
    assert store.versions() == [3, 4] and store.latest() == 4
    assert store.transport.versions() == [3, 4]
    assert shm_files(prefix) == [f"forge-w-{prefix}-v3", f"forge-w-{prefix}-v4"]
    assert store.pull()["w"].tolist() == [4.0, 4.0, 4.0]  # default: latest
    assert store.pull(3)["w"].tolist() == [3.0, 3.0, 3.0]

    with pytest.raises(KeyError) as err:
        store.pull(1)
    assert str(err.value) == (
        "weight version 1 was dropped by the retention policy (keep_last=2); available: [3, 4]"
    )
    with pytest.raises(
        WeightVersionError, match=r"^weight version 9 was never pushed \(known: \[3, 4\]\)$"
    ):
        store.pull(9)
    with pytest.raises(ValueError, match="weight version 4 is not newer than the latest pushed"):
        store.push({"w": torch.zeros(3)}, 4)
    store.close()
    assert shm_files(prefix) == []


def test_shm_drop_unlinks_file_with_no_leak(prefix):
    before = sorted(os.listdir(SHM))
    transport = SharedMemoryTransport(prefix)
    transport.push({"w": torch.ones(1000)}, version=0)
    path = transport.path(0)
    assert os.path.exists(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(SHM)) == sorted([*before, os.path.basename(path)])  # no temp left
    with pytest.raises(ValueError, match="weight version 0 already exists"):
        transport.push({"w": torch.ones(1)}, version=0)
    transport.drop(0)
    assert sorted(os.listdir(SHM)) == before
    transport.drop(0)  # already gone: a no-op


def test_shm_missing_version_is_a_bounded_clear_error(prefix):
    transport = SharedMemoryTransport(prefix, wait_s=0.2)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=rf"weight version 42 .*forge-w-{prefix}-v42"):
        transport.pull(42)
    assert 0.2 <= time.monotonic() - start < 5.0
    with pytest.raises(ValueError, match="prefix 'a/b' must be"):
        SharedMemoryTransport("a/b")


def test_safetensors_dir_round_trip(tmp_path):
    transport = SafetensorsDirTransport(tmp_path / "weights")
    sd = mixed_state_dict(seed=2)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied weights share storage
    handle = transport.push(sd, version=2)
    assert (tmp_path / "weights" / "v2" / "model.safetensors").is_file()
    assert transport.versions() == [2]
    assert_same(transport.pull(2), sd)  # push order kept
    # The manifest's offsets point at each tensor's bytes inside the file.
    raw = (tmp_path / "weights" / "v2" / "model.safetensors").read_bytes()
    meta = handle.manifest["model.layers.0.mlp.up_proj.weight"]
    expected = sd["model.layers.0.mlp.up_proj.weight"].contiguous().view(torch.uint8)
    assert raw[meta.offset : meta.offset + meta.nbytes] == bytes(expected.reshape(-1).tolist())

    into = {name: torch.zeros_like(t) for name, t in sd.items()}
    assert pull_handle(pickle.loads(pickle.dumps(handle)), into=into) is into
    assert_same(into, sd)
    transport.drop(2)
    assert transport.versions() == []
    with pytest.raises(FileNotFoundError, match="weight version 2 not found"):
        transport.pull(2)


def test_build_weight_transport(tmp_path, prefix):
    assert isinstance(build_weight_transport("shm", prefix=prefix), SharedMemoryTransport)
    built = build_weight_transport("safetensors_dir", root=tmp_path)
    assert isinstance(built, SafetensorsDirTransport)
    with pytest.raises(ValueError, match=r"unknown weight transport type: 'nccl'; choose one of"):
        build_weight_transport("nccl")


def test_plan_buckets_by_dtype_and_size():
    manifest = [
        ("a", "float32", (4,)),  # 16 bytes
        ("b", "bfloat16", (8,)),  # 16 bytes
        ("c", "float32", (2, 2)),  # 16 bytes: a + c = 32 fits one bucket
        ("d", "float32", (3,)),  # 12 bytes: would make 44 > 40, new bucket
        ("e", "float32", (100,)),  # 400 bytes > 40: a bucket of its own
    ]
    plan = plan_buckets(manifest, bucket_bytes=40)
    assert [(b.dtype, b.names) for b in plan] == [
        (torch.float32, ("a", "c")),
        (torch.float32, ("d",)),
        (torch.float32, ("e",)),
        (torch.bfloat16, ("b",)),
    ]
    assert plan[0].numels == [4, 4]


_BROADCAST_WORKER = """
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
sys.path.insert(0, {tests_dir!r})
from test_weights import assert_same, mixed_state_dict
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
    code = _BROADCAST_WORKER.format(
        tests_dir=str(Path(__file__).parent), init=f"file://{tmp_path / 'pg_init'}"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank)],
            cwd=REPO_ROOT,
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
