"""Versioned weights in one process: shm and safetensors transports, the store's retention
and errors, tied weights, leases, bucket planning. Across real processes (another reader,
concurrent readers, a 2-process gloo broadcast): tests/integration/components/test_weights_processes.py,
which imports ``mixed_state_dict`` and ``assert_same`` from here."""

from __future__ import annotations

import fcntl
import os
import pickle
import stat
import time
import uuid

import pytest
import torch

from forge.weights import (
    SafetensorsDirTransport,
    SharedMemoryTransport,
    WeightStore,
    WeightTransportConfig,
    WeightVersionError,
    build_transport,
    plan_buckets,
    pull_handle,
)
from forge.weights.shm import close_mappings, lease_shm_file, read_shm_file

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


def test_store_retention_and_version_errors(prefix):
    store = WeightStore(SharedMemoryTransport(prefix), keep_last=2)
    for version in range(1, 5):
        store.push({"w": torch.full((3,), float(version))}, version)
    assert store.versions() == [3, 4] and store.latest() == 4
    assert store.transport.versions() == [3, 4]
    # Dropped versions' names are gone; one file is kept as a spare for the next push.
    files = shm_files(prefix)
    assert [n.split(f"-{prefix}-")[1][:2] for n in files[-2:]] == ["v3", "v4"]
    assert len(files) == 3 and files[0].startswith(f"forge-w-{prefix}-spare-")
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
    # Only this test's files: other tests (another xdist worker) create and remove theirs.
    def mine() -> list[str]:
        return sorted(f for f in os.listdir(SHM) if prefix in f)

    before = mine()
    transport = SharedMemoryTransport(prefix, spares=0)
    transport.push({"w": torch.ones(1000)}, version=0)
    path = transport.path(0)
    assert os.path.exists(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert mine() == sorted([*before, os.path.basename(path)])  # no temp left
    with pytest.raises(ValueError, match="weight version 0 already exists"):
        transport.push({"w": torch.ones(1)}, version=0)
    transport.drop(0)
    assert mine() == before
    transport.drop(0)  # already gone: a no-op


def test_shm_missing_version_is_a_bounded_clear_error(prefix):
    transport = SharedMemoryTransport(prefix, wait_s=0.2)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=rf"weight version 42 .*forge-w-{prefix}-v42"):
        transport.pull(42)
    assert 0.2 <= time.monotonic() - start < 5.0
    with pytest.raises(ValueError, match="prefix 'a/b' must be"):
        SharedMemoryTransport("a/b")
    with pytest.raises(ValueError, match="spares must be an int >= 0, got -1"):
        SharedMemoryTransport(prefix, spares=-1)


def test_shm_recycles_dropped_file_and_keeps_versions_apart(prefix, tmp_path):
    transport = SharedMemoryTransport(prefix, spares=1)
    sds = {v: mixed_state_dict(seed=v) for v in (1, 2, 3)}
    transport.push(sds[1], version=1)
    inode_1 = os.stat(transport.path(1)).st_ino
    transport.push(sds[2], version=2)
    # A late reader's only way in after the drop: a second name for version 1's file.
    late = str(tmp_path.parent / f"late-{prefix}")
    os.link(transport.path(1), f"{SHM}/{os.path.basename(late)}")
    late = f"{SHM}/{os.path.basename(late)}"
    try:
        assert_same(read_shm_file(late, 1), sds[1])
        transport.drop(1)
        assert not os.path.exists(transport.path(1)) and transport.versions() == [2]
        transport.push(sds[3], version=3)
        assert os.stat(transport.path(3)).st_ino == inode_1  # rewritten, not a new file
        assert_same(transport.pull(3), sds[3])
        assert_same(transport.pull(2), sds[2])  # the live version is untouched
        # The recycled file now says version 3: the late reader is told, never given a mix.
        with pytest.raises(FileNotFoundError, match=r"weight version 1 .* now holds version 3"):
            read_shm_file(late, 1)
    finally:
        os.unlink(late)
    transport.close()
    assert shm_files(prefix) == []


def test_shm_spare_held_by_a_reader_is_not_rewritten(prefix):
    transport = SharedMemoryTransport(prefix, spares=1)
    meta = transport.push({"w": torch.full((1000,), 1.0)}, version=1).manifest["w"]
    transport.push({"w": torch.full((1000,), 2.0)}, version=2)
    reader = os.open(transport.path(1), os.O_RDONLY)  # a reader mid-copy holds LOCK_SH
    try:
        fcntl.flock(reader, fcntl.LOCK_SH)
        inode_1 = os.fstat(reader).st_ino
        transport.drop(1)
        transport.push({"w": torch.full((1000,), 3.0)}, version=3)
        assert os.stat(transport.path(3)).st_ino != inode_1  # a fresh file instead
        data = bytearray(os.pread(reader, meta.nbytes, meta.offset))
        assert torch.frombuffer(data, dtype=torch.float32).eq(1.0).all()  # still version 1
    finally:
        os.close(reader)
    assert transport.pull(3)["w"].eq(3.0).all()
    transport.close()
    assert shm_files(prefix) == []


def test_shm_lease_shares_one_copy_and_blocks_recycling_until_released(prefix):
    transport = SharedMemoryTransport(prefix, spares=1)
    sd = mixed_state_dict(seed=1)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    h1 = transport.push(sd, version=1)
    views, lease = lease_shm_file(h1.location, 1, h1.manifest)
    again, lease_b = lease_shm_file(transport.path(1), 1)  # by name, manifest from the header
    assert_same(views, sd)
    assert_same(again, sd)
    assert views["lm_head.weight"] is views["model.embed_tokens.weight"]
    # No copy: both leases' tensors are the same bytes of the one kept mapping.
    name = "model.embed_tokens.weight"
    assert views[name].data_ptr() == again[name].data_ptr()
    inode_1 = os.stat(h1.location).st_ino
    transport.push(mixed_state_dict(seed=2), version=2)
    transport.drop(1)  # its file becomes the spare, but leases hold it
    transport.push(mixed_state_dict(seed=3), version=3)
    assert os.stat(transport.path(3)).st_ino != inode_1  # written elsewhere
    assert_same(views, sd)  # the leased version is intact
    lease.release()
    lease.release()  # idempotent
    transport.drop(2)
    transport.push(mixed_state_dict(seed=4), version=4)
    assert os.stat(transport.path(4)).st_ino != inode_1  # lease_b still holds version 1
    assert_same(again, sd)
    del again
    lease_b.release()
    assert not lease_b.held and "released" in repr(lease_b)
    transport.drop(3)
    # The spares now include version 1's file, free at last: the next push may rewrite it.
    transport.push(mixed_state_dict(seed=5), version=5)
    assert_same(transport.pull(5), mixed_state_dict(seed=5))
    with pytest.raises(FileNotFoundError, match="weight version 1 is not in shared memory"):
        lease_shm_file(transport.path(1), 1)
    del views
    transport.close()
    assert shm_files(prefix) == []


def test_shm_tied_weights_stored_once_and_pulled_tied(prefix):
    transport = SharedMemoryTransport(prefix)
    sd = mixed_state_dict()
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    handle = transport.push(sd, version=1)
    embed, head = handle.manifest["model.embed_tokens.weight"], handle.manifest["lm_head.weight"]
    assert embed == head and handle.nbytes == sum(
        t.numel() * t.element_size() for n, t in sd.items() if n != "lm_head.weight"
    )
    fresh = transport.pull(1)
    assert_same(fresh, sd)
    assert fresh["lm_head.weight"] is fresh["model.embed_tokens.weight"]
    # Into a model whose tied tensors share memory, and into one whose tensors do not.
    tied = {n: torch.zeros_like(t) for n, t in sd.items()}
    tied["lm_head.weight"] = tied["model.embed_tokens.weight"]
    assert_same(transport.pull(1, into=tied), sd)
    untied = {n: torch.zeros_like(t) for n, t in sd.items()}
    assert_same(transport.pull(1, into=untied), sd)
    transport.close()


def test_shm_kept_mappings_release_unlinked_files(prefix):
    transport = SharedMemoryTransport(prefix)
    other = SharedMemoryTransport(f"{prefix}-other")
    transport.push({"w": torch.ones(1000)}, version=1)
    other.push({"w": torch.ones(10)}, version=1)
    path = transport.path(1)
    transport.pull(1)

    def mapped() -> list[str]:
        with open("/proc/self/maps") as f:
            return [line.split(None, 5)[-1].strip() for line in f if path in line]

    assert mapped() == [path]  # kept for the next pull of this file
    transport.close()
    assert mapped() == [f"{path} (deleted)"]  # still holding the memory...
    other.pull(1)
    assert mapped() == []  # ...until the next pull sees it was unlinked
    close_mappings()
    other.close()


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


def test_build_transport_from_one_config(tmp_path, prefix):
    shm = build_transport(WeightTransportConfig(prefix=prefix, spares=0, wait_s=1.5))
    assert isinstance(shm, SharedMemoryTransport)
    assert (shm.prefix, shm.spares, shm.wait_s) == (prefix, 0, 1.5)
    on_disk = WeightTransportConfig(type="safetensors_dir", root=str(tmp_path), keep_last=3)
    built = build_transport(on_disk)
    assert isinstance(built, SafetensorsDirTransport) and built.root == tmp_path


def test_weight_transport_config_is_checked_when_built():
    with pytest.raises(
        ValueError,
        match=r"unknown weight transport type 'nccl'; choose one of \['broadcast', "
        r"'safetensors_dir', 'shm'\] \(for an nccl broadcast: type: broadcast, backend: nccl\)",
    ):
        WeightTransportConfig(type="nccl")
    # A knob of the other transport would be silently ignored: an error instead.
    with pytest.raises(ValueError, match=r"root='/x' applies to type 'safetensors_dir' only"):
        WeightTransportConfig(type="shm", root="/x")
    for knob in ({"prefix": "p"}, {"shm_dir": "/tmp"}, {"spares": 0}, {"share": False}):
        with pytest.raises(ValueError, match="applies to type 'shm' only"):
            WeightTransportConfig(type="safetensors_dir", root="/x", **knob)
    with pytest.raises(ValueError, match="'safetensors_dir' needs root"):
        WeightTransportConfig(type="safetensors_dir")
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        WeightTransportConfig(keep_last=0)
    with pytest.raises(ValueError, match="spares must be >= 0"):
        WeightTransportConfig(spares=-1)
    with pytest.raises(ValueError, match="wait_s must be >= 0"):
        WeightTransportConfig(wait_s=-1.0)


def test_trainer_generator_and_reference_share_one_weights_type(tmp_path):
    """One ``weights:`` section can flow to every role: the same dataclass on each side, and
    YAML keys are checked where the config loads."""
    from forge.config import config_from_dict
    from forge.generation.backend import GeneratorConfig
    from forge.training.trainer_config import ReferenceConfig, TrainerConfig

    section = {"type": "safetensors_dir", "root": str(tmp_path), "keep_last": 3}
    trainer = config_from_dict(TrainerConfig, {"model": "m", "weights": section})
    gen = config_from_dict(GeneratorConfig, {"model": "m", "weights": section})
    ref = config_from_dict(ReferenceConfig, {"model": "m", "weights": section})
    assert trainer.weights == gen.weights == ref.weights
    assert type(trainer.weights) is type(gen.weights) is WeightTransportConfig
    with pytest.raises(ValueError, match=r"weights.transport: unknown key 'transport'"):
        config_from_dict(GeneratorConfig, {"model": "m", "weights": {"transport": "shm"}})
    with pytest.raises(ValueError, match=r"weights.*root='/x' applies to type 'safetensors_dir'"):
        config_from_dict(TrainerConfig, {"model": "m", "weights": {"root": "/x"}})


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


def test_a_bf16_push_halves_the_bytes_and_keeps_ties_ints_and_bf16_values(prefix):
    from forge.weights.store import cast_floating

    sd = mixed_state_dict()
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied
    assert cast_floating(sd, "") is sd
    cast = cast_floating(sd, "bfloat16")
    assert cast["lm_head.weight"] is cast["model.embed_tokens.weight"]
    for name, t in sd.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert cast[name].dtype == want.dtype and torch.equal(cast[name], want), name
    transport = SharedMemoryTransport(prefix)
    full, half = transport.push(sd, version=1), transport.push(cast, version=2)
    assert half.manifest["lm_head.weight"] == half.manifest["model.embed_tokens.weight"]
    big = "model.embed_tokens.weight"
    assert half.manifest[big].nbytes * 2 == full.manifest[big].nbytes
    assert_same(transport.pull(2), cast)  # a bf16 model loads exactly what it would round to
    transport.close()


def test_the_weights_dtype_knob_is_checked_at_load():
    from forge.config import config_from_dict
    from forge.weights import WeightTransportConfig

    assert config_from_dict(WeightTransportConfig, {"dtype": "bfloat16"}).dtype == "bfloat16"
    with pytest.raises((ValueError, TypeError), match="bf16.*bfloat16"):
        config_from_dict(WeightTransportConfig, {"dtype": "bf16"})
