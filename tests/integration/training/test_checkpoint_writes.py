"""Checkpoint writes survive failure at any point: a save that fails (a full disk) or is
killed midway leaves the previous checkpoint published and loadable and frees what it wrote;
every file and directory of a checkpoint is flushed (``fsync``) before ``latest`` names it;
only the newest ``keep_last`` stay. The same holds for ``forge serve``'s ``save_state``
checkpoints, which replace one of the same name.

The full disk is a small tmpfs (``mount -t tmpfs``, root only: skipped where not allowed)
filled to leave a given number of bytes free, swept across the size of a checkpoint so the
disk fills at every point of a save. Trainer, replay buffer and data source are in-process
fakes writing files as the real ones do (a safetensors file and ``torch.save``)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import forge.durable
from forge.run.checkpoint import Checkpointer
from forge.training.trainer_checkpoint import safe_load

PAGE = 4096
N = 8192  # float32 weights of the fake trainer: 32 KiB


class _Endpoint:
    def __init__(self, fn) -> None:
        self.fn = fn

    async def call(self, *args):
        return self.fn(*args)

    call_one = call


def weights(step: int) -> torch.Tensor:
    """The fake trainer's weights at ``step``: a checkpoint grows a little with each step, so
    a new version never fits exactly where the old one was."""
    return torch.full((N + 256 * step,), float(step))


class FakeTrainer:
    """Writes what a trainer checkpoint holds: weights (safetensors) and a torch.save file."""

    FILES = ("model.safetensors", "trainer_state.pt")

    def __init__(self) -> None:
        self.step = 0
        self.fail_at: int | None = None  # fail (disk full) while writing FILES[fail_at]
        self.save = _Endpoint(self._save)

    def _save(self, path: str) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(self.FILES):
            if i == self.fail_at:  # half a file, then the disk is full
                Path(path, name).write_bytes(b"\0" * 100)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{path}/{name}")
            if name.endswith(".safetensors"):
                save_file({"w": weights(self.step)}, f"{path}/{name}")
            else:
                torch.save({"step": self.step}, f"{path}/{name}")
        return path


class Fakes:
    def __init__(self) -> None:
        self.trainer = FakeTrainer()
        self.buffer = type("Buffer", (), {"state_dict": _Endpoint(lambda: {"n": self.step})})()
        self.data = type("Data", (), {"state_dict": _Endpoint(lambda: {"pos": self.step})})()

    @property
    def step(self) -> int:
        return self.trainer.step

    def save(self, ckpt: Checkpointer, step: int):
        self.trainer.step = step
        return asyncio.run(ckpt.maybe_save(step, self.trainer, self.buffer, self.data))


def loadable_step(ckpt: Checkpointer) -> int:
    """The step of the published checkpoint, after loading every file of it and checking
    they agree (a torn or mixed checkpoint fails here)."""
    path = ckpt.latest()
    assert path is not None and path.is_dir(), f"latest names {path}, which is not there"
    state = safe_load(path / "state.pt")
    step = state["step"]
    assert state["buffer"] == {"n": step} and state["data"] == {"pos": step}
    assert safe_load(path / "trainer" / "trainer_state.pt") == {"step": step}
    assert torch.equal(load_file(path / "trainer" / "model.safetensors")["w"], weights(step))
    assert ckpt.latest_step() == step
    return step


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if out.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(disk: Path, leave: int) -> Path:
    """A file taking all free space of ``disk`` but ``leave`` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        size = max(0, _free(disk) - leave)
        if size:
            os.posix_fallocate(f.fileno(), 0, size)
    return filler


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


def test_a_save_failing_on_a_full_disk_at_any_point_keeps_the_previous_one(small_disk, capsys):
    fakes, ckpt = Fakes(), Checkpointer(small_disk / "run", every=1, keep_last=1)
    fakes.save(ckpt, 1)
    size = sum(f.stat().st_size for f in ckpt.latest().rglob("*") if f.is_file())
    step, failed = 1, 0
    for leave in range(0, size + 6 * PAGE, PAGE):
        filler = _fill(small_disk, leave)
        free_before = _free(small_disk)
        try:
            fakes.save(ckpt, step + 1)
            step += 1
        except (OSError, SafetensorError, RuntimeError) as e:  # as each writer reports it
            assert "is intact" in capsys.readouterr().err, e
            failed += 1
            assert _free(small_disk) >= free_before, "a failed save left what it wrote"
        assert loadable_step(ckpt) == step
        assert _leftovers(ckpt.root) == [], "a save left temporary files"
        assert len(list(ckpt.root.glob("step_*"))) == 1  # keep_last=1
        filler.unlink()
    assert failed > 5 and step > 1, (failed, step)  # the disk filled at many points, then not


def _killing(limit: int):
    """Patches that end this (forked) process just before the ``limit``-th file operation."""
    count = [0]

    def wrap(fn):
        def op(*args, **kwargs):
            count[0] += 1
            if count[0] >= limit:
                os._exit(9)
            return fn(*args, **kwargs)

        return op

    return [
        (os, name, wrap(getattr(os, name)))
        for name in ("rename", "replace", "fsync", "open", "unlink", "rmdir", "mkdir")
    ] + [
        (shutil, "rmtree", wrap(shutil.rmtree)),
        (torch, "save", wrap(torch.save)),
        (forge.durable, "_exchange", wrap(forge.durable._exchange)),
    ]


def test_a_save_killed_at_any_point_keeps_a_whole_checkpoint(tmp_path):
    fakes, ckpt = Fakes(), Checkpointer(tmp_path / "run", every=1, keep_last=2)
    fakes.save(ckpt, 1)
    fakes.save(ckpt, 2)
    step, completed = 2, False
    for limit in range(1, 400):  # bounded: a save makes far fewer operations
        pid = os.fork()
        if pid == 0:  # the child saves, killed just before operation number `limit`
            for module, name, fn in _killing(limit):
                setattr(module, name, fn)
            fakes.save(ckpt, step + 1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert loadable_step(ckpt) in (step, step + 1)
        if os.waitstatus_to_exitcode(status) == 0:
            completed = True
            break
        step = loadable_step(ckpt)
        # The next save, in a process that is not killed, works and cleans up after it.
        fakes.save(ckpt, step + 1)
        step += 1
        assert loadable_step(ckpt) == step and _leftovers(ckpt.root) == []
        assert len(list(ckpt.root.glob("step_*"))) == 2
    assert completed and limit > 10, limit


def test_every_file_and_directory_is_flushed_before_latest_names_it(tmp_path, monkeypatch):
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        real_replace(src, dst, **kw)
        events.append(("replace", Path(dst).name))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    fakes, ckpt = Fakes(), Checkpointer(tmp_path / "run", every=1)
    for step in (1, 2):
        events.clear()
        final = fakes.save(ckpt, step)
        published = events.index(("replace", "latest"))
        flushed = {ino for kind, ino in events[:published] if kind == "fsync"}
        for p in [final, *final.rglob("*")]:
            assert p.stat().st_ino in flushed, f"{p} was not flushed before latest named it"
        root = ckpt.root.stat().st_ino
        assert ("fsync", root) in events[published:], "the rename of latest was not flushed"
        assert ("fsync", (ckpt.root / "latest").stat().st_ino) in events[:published]


def test_keep_last_keeps_the_newest_and_zero_keeps_all(tmp_path):
    fakes = Fakes()
    for keep in (0, 1, 3):
        ckpt = Checkpointer(tmp_path / f"run{keep}", every=2, keep_last=keep)
        for step in range(1, 12):
            fakes.save(ckpt, step)
        names = sorted(p.name for p in ckpt.root.glob("step_*"))
        expect = [f"step_{s:06d}" for s in range(2, 12, 2)]
        assert names == (expect[-keep:] if keep else expect)
        assert loadable_step(ckpt) == 10
    with pytest.raises(ValueError, match="keep_last must be >= 0"):
        Checkpointer(tmp_path, every=1, keep_last=-1)
    from forge.config import config_from_dict
    from forge.run.rl_config import RLConfig

    rl = {"app": "x", "policy": {"model": "/m"}, "data": "jsonl", "rewards": ["exact_match"]}
    assert config_from_dict(RLConfig, rl).checkpoint_keep_last == 2
    with pytest.raises(ValueError, match="checkpoint_keep_last must be >= 0"):
        config_from_dict(RLConfig, {**rl, "checkpoint_keep_last": -1})


@pytest.mark.parametrize("lora", [False, True])
def test_a_trainer_checkpoint_is_flushed_when_save_returns(tiny_model, tmp_path, monkeypatch, lora):
    from forge.training import TrainerConfig, TrainerCore, save_checkpoint
    from forge.training.trainer_config import LoraConfig

    core = TrainerCore(TrainerConfig(model=tiny_model, lora=LoraConfig(rank=2) if lora else None))
    flushed, real_fsync = set(), os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.add(os.fstat(fd).st_ino) or real_fsync(fd))
    path = save_checkpoint(tmp_path / "ckpt", core)
    for p in [path, *path.rglob("*")]:
        assert p.stat().st_ino in flushed, f"{p.name} was not flushed"


# -- forge serve -------------------------------------------------------------------------


def test_a_serve_checkpoint_replaced_on_a_full_disk_stays_loadable(small_disk):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from forge.serve.app import CHECKPOINT_META, build_app, checkpoint_meta
    from forge.serve.serve_config import ServeConfig, toy_models
    from forge.serve.state import ServedModel, ServerState

    key, model_id = "tml-serve-ckpt-key-0123456789abcdefgh", "session-0:train:0"
    state = ServerState(ServeConfig(models=toy_models(), dir=str(small_disk / "serve")))
    trainer = FakeTrainer()
    base = state.cfg.base("forge/tiny")
    state.models[model_id] = ServedModel(model_id, base, base.path, 4, trainer, None)
    target = small_disk / "serve" / model_id / "c"

    def save(version: int) -> dict:
        trainer.step = version
        body = {"model_id": model_id, "path": "c", "overwrite": True}
        r = client.post("/api/v1/save_weights", json=body, headers={"X-API-Key": key})
        assert r.status_code == 200, r.text
        r = client.post(
            "/api/v1/retrieve_future",
            json={"request_id": r.json()["request_id"]},
            headers={"X-API-Key": key},
        )
        return r.json()

    def loadable_version() -> int:
        assert checkpoint_meta(target)["base_model"] == "forge/tiny"
        version = safe_load(target / "trainer_state.pt")["step"]
        assert torch.equal(load_file(target / "model.safetensors")["w"], weights(version))
        return version

    with TestClient(build_app(state, key)) as client:
        assert "error" not in save(1)
        size = sum(f.stat().st_size for f in target.iterdir())
        version, failed = 1, 0
        for leave in range(0, size + 6 * PAGE, PAGE):
            filler = _fill(small_disk, leave)
            out = save(version + 1)
            if "error" in out:
                failed += 1
                assert out.get("category") == "server", out
            else:
                version += 1
            assert loadable_version() == version
            assert (target / CHECKPOINT_META).is_file()
            assert _leftovers(target.parent) == [], "a save left temporary files"
            filler.unlink()
        assert failed > 5 and version > 1, (failed, version)
        for fail_at in range(len(FakeTrainer.FILES)):  # the trainer fails at each file
            trainer.fail_at = fail_at
            assert save(version + 1)["category"] == "server"
            assert loadable_version() == version and _leftovers(target.parent) == []
        trainer.fail_at = None
        assert "error" not in save(version + 1) and loadable_version() == version + 1
