"""WandbBackend with the real wandb package, offline: what it logs reads back from the run's
``.wandb`` file (the records ``wandb sync`` would upload).

A components test because wandb starts a service process (``wandb-core``). CI installs the
extra (`scripts/test.sh`); elsewhere this skips without `forge[wandb]`.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb", reason="needs forge[wandb]")

import wandb
from wandb.proto import wandb_internal_pb2

from forge.observability import WandbBackend, build_backends

BLOCK, HEADER = 32768, 7  # the .wandb file is a LevelDB-style log of 32 KiB blocks
FULL, LAST = 1, 4  # chunk types that end a record


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
    """Offline mode from the environment, and wandb's own files kept out of $HOME."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    yield
    wandb.teardown()  # stop the service process this test started


def _records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: a 7-byte file header, then chunks of
    ``crc32 (4) | length (2) | type (1) | payload``, a block's tail under 7 bytes padding."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, payload, records = HEADER, b"", []
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        payload += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
    return records


def _key(item) -> str:
    """A record item's key: plain, or (for keys with a ``/`` in them) split into parts."""
    return item.key or "/".join(item.nested_key)


def _read_run(run_dir: Path) -> tuple:
    """``(run record, {step: {key: value}})`` of the one offline run under ``run_dir``."""
    [path] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb-core writes the file after finish() returns (0.31 leaves it at its 7-byte
    # header for ~50 ms now and then): wait, bounded, for the run's exit record.
    deadline = time.monotonic() + 30
    records = _records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path} has no exit record 30 s after finish()"
        time.sleep(0.05)
        records = _records(path)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {_key(i): json.loads(i.value_json) for i in r.history.item}
            history[r.history.step.num] = {k: v for k, v in items.items() if k[0] != "_"}
    return run, history


def test_logged_steps_and_config_read_back(tmp_path):
    run_dir = tmp_path / "run"
    [backend] = build_backends(
        ["wandb"], run_dir, wandb_project="forge-test", run_name="r1", config={"lr": 0.1}
    )
    assert isinstance(backend, WandbBackend)
    backend.log(1, {"loss": 0.5, "reward/mean": 0.25})
    backend.log(2, {"loss": 0.25, "reward/mean": 0.75})
    backend.log(2, {"eval/accuracy": 1.0})  # an extra row for the same step joins it
    backend.close()
    backend.close()  # safe twice, like every backend
    with pytest.raises(ValueError, match="is closed; cannot log step 3"):
        backend.log(3, {"loss": 1.0})

    run, history = _read_run(run_dir)
    assert (run.project, run.display_name) == ("forge-test", "r1")
    assert {_key(i): json.loads(i.value_json) for i in run.config.update}["lr"] == 0.1
    assert history == {
        1: {"loss": 0.5, "reward/mean": 0.25},
        2: {"loss": 0.25, "reward/mean": 0.75, "eval/accuracy": 1.0},
    }


def test_two_open_backends_keep_their_own_runs(tmp_path):
    first = WandbBackend(tmp_path / "a", name="a")
    second = WandbBackend(tmp_path / "b", name="b")
    first.log(1, {"loss": 1.0})
    second.log(1, {"loss": 2.0})
    second.close()
    first.log(2, {"loss": 0.5})  # closing the second left the first's run open
    first.close()
    run_a, history_a = _read_run(tmp_path / "a")
    run_b, history_b = _read_run(tmp_path / "b")
    assert run_a.run_id != run_b.run_id
    assert history_a == {1: {"loss": 1.0}, 2: {"loss": 0.5}}
    assert history_b == {1: {"loss": 2.0}}
