"""Another local user plants files where Forge will write or read: weight files in /dev/shm
under the names a push would use (or used to use), a symbolic link, and the staging directory
in /tmp. The push still succeeds, a puller never reads a planted file, and the staging root is
refused with a named error unless it is this user's own directory with mode 0700."""

from __future__ import annotations

import os
import re
import stat
import tempfile
import uuid

import pytest
import torch

from controller import files
from forge.weights.shm import SharedMemoryTransport, read_shm_file, write_shm_file

SHM = "/dev/shm"
NOBODY = 65534
ROOT = os.geteuid() == 0


@pytest.fixture
def prefix():
    p = f"hostile-{uuid.uuid4().hex[:8]}"
    yield p
    for name in os.listdir(SHM):
        if name.startswith(f"forge-w-{p}-"):
            os.unlink(os.path.join(SHM, name))


def _plant(path: str, state: dict, version: int, owner: int | None = NOBODY) -> None:
    """A valid-looking weight file at ``path``, readable by all, owned by ``owner``."""
    write_shm_file(path, state, version)
    os.chmod(path, 0o644)
    if owner is not None and ROOT:
        os.chown(path, owner, owner)


def test_a_planted_file_neither_blocks_a_push_nor_is_read(prefix):
    planted = {"w": torch.full((4,), 666.0)}
    mine = {"w": torch.full((4,), 1.0)}
    # The old, predictable name, and one that matches the new pattern.
    old_name = f"{SHM}/forge-w-{prefix}-v1"
    new_name = f"{SHM}/forge-w-{prefix}-v1-{'ab' * 8}"
    _plant(old_name, planted, 1)
    _plant(new_name, planted, 1)
    t = SharedMemoryTransport(prefix)
    assert t.versions() == []  # planted names are not versions
    handle = t.push(mine, 1)
    assert handle.location not in (old_name, new_name)
    assert re.fullmatch(rf"{SHM}/forge-w-{prefix}-v1-[0-9a-f]{{16}}\.forge-.*", handle.location)
    assert stat.S_IMODE(os.stat(handle.location).st_mode) == 0o600
    for puller in (t, SharedMemoryTransport(prefix)):  # the pusher; a fresh instance
        assert torch.equal(puller.pull(handle)["w"], mine["w"])
        assert torch.equal(puller.pull(1)["w"], mine["w"])
    with pytest.raises(PermissionError, match="refusing a file another user could have planted"):
        read_shm_file(new_name, 1)
    t.close()


def test_push_names_are_unpredictable(prefix):
    t = SharedMemoryTransport(prefix, spares=0)
    names = set()
    for _ in range(3):
        names.add(os.path.basename(t.push({"w": torch.zeros(2)}, 7).location))
        t.drop(7)
    assert len(names) == 3  # the same version gets a new random name each time
    t.close()


def test_a_planted_symbolic_link_is_refused(prefix, tmp_path):
    target = tmp_path / "elsewhere"
    write_shm_file(str(target), {"w": torch.ones(2)}, 3)
    link = f"{SHM}/forge-w-{prefix}-v3-{'cd' * 8}"
    os.symlink(target, link)
    t = SharedMemoryTransport(prefix)
    assert t.versions() == []
    with pytest.raises(PermissionError, match="not a regular file"):
        read_shm_file(link, 3)
    with pytest.raises(FileNotFoundError, match="weight version 3"):
        t.pull(3)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / f"forge-staged-{os.getuid()}"


def test_staging_root_is_made_private(private_tmp):
    assert files.staging_root() == str(private_tmp)
    assert stat.S_IMODE(os.lstat(private_tmp).st_mode) == 0o700


def test_staging_root_open_to_others_is_refused(private_tmp):
    private_tmp.mkdir()
    private_tmp.chmod(0o777)
    with pytest.raises(PermissionError, match="mode 777.*Remove it"):
        files.staging_root()


def test_staging_root_as_a_link_is_refused(private_tmp, tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o700)
    private_tmp.symlink_to(tmp_path / "theirs")
    with pytest.raises(PermissionError, match="is a symbolic link"):
        files.staging_root()


@pytest.mark.skipif(not ROOT, reason="making a directory another user's needs root")
def test_staging_root_of_another_user_is_refused(private_tmp):
    private_tmp.mkdir(mode=0o700)
    os.chown(private_tmp, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"owned by uid {NOBODY}"):
        files.staging_root()
