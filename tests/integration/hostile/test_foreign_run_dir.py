"""``forge run --resume`` of a run directory someone else wrote: refused before anything in it
is read (``ForeignRunDirError``), and a planted checkpoint in a directory the user does own
(a copy) is not unpickled (``UnsafeCheckpointError``). Each case checks that nothing ran,
nothing in the directory changed and no process was left."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys

import pytest
import torch

from forge.run.checkpoint import Checkpointer
from forge.run.ownership import ForeignRunDirError, check_run_dir
from forge.training.trainer_checkpoint import UnsafeCheckpointError
from tests.helpers import REPO, script_env

NOBODY = 65534


class _Planted:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _run_dir(root, marker) -> object:
    """A run directory as ``forge run`` leaves it, with a planted ``state.pt``."""
    run = root / "run"
    step = run / "checkpoints" / "step_000002"
    (step / "trainer").mkdir(parents=True)
    (run / "config.yaml").write_text((REPO / "apps/sumdigits/cpu.yaml").read_text())
    (run / "checkpoints" / "latest").write_text('{"step": 2, "dir": "step_000002"}')
    torch.save({"step": 2, "buffer": _Planted(str(marker)), "data": {}}, step / "state.pt")
    for p in [run, *run.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return run


def _digest(run) -> dict:
    return {
        str(p): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None,
            p.stat().st_mode,
            p.stat().st_uid,
        )
        for p in sorted(run.rglob("*"))
    }


def _resume(run) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", "--resume", str(run)],
        cwd=str(REPO),
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_directory_others_can_write_is_refused_unread(tmp_path):
    marker = tmp_path / "pwned"
    run = _run_dir(tmp_path, marker)
    check_run_dir(run)  # the user's own, as written: fine
    os.chmod(run / "checkpoints", 0o777)
    before = _digest(run)
    out = _resume(run)
    assert out.returncode == 2, out.stderr
    assert "refused" in out.stderr and "checkpoints is writable by every user" in out.stderr
    assert not marker.exists() and _digest(run) == before  # nothing ran, nothing changed


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_run_directory_owned_by_another_user_is_refused_unread(tmp_path):
    marker = tmp_path / "pwned"
    run = _run_dir(tmp_path, marker)
    os.chown(run / "checkpoints" / "step_000002" / "state.pt", NOBODY, NOBODY)
    before = _digest(run)
    out = _resume(run)
    assert out.returncode == 2, out.stderr
    assert "state.pt belongs to" in out.stderr and "refused" in out.stderr
    assert not marker.exists() and _digest(run) == before
    # Writable by a group that is not the user's own private group: refused too.
    os.chown(run / "checkpoints" / "step_000002" / "state.pt", 0, 0)
    os.chown(run / "checkpoints", 0, NOBODY)
    os.chmod(run / "checkpoints", 0o775)
    with pytest.raises(ForeignRunDirError, match=f"checkpoints is writable by group {NOBODY}"):
        check_run_dir(run)


def test_a_parent_others_can_swap_out_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    run = _run_dir(shared, tmp_path / "pwned")
    os.chmod(shared, 0o777)
    with pytest.raises(ForeignRunDirError, match="above it.*without the sticky bit"):
        check_run_dir(run)
    os.chmod(shared, 0o1777)  # like /tmp: others cannot rename what is ours
    check_run_dir(run)


def test_a_planted_checkpoint_in_a_copied_run_directory_is_not_unpickled(tmp_path):
    # A copy (cp -r) belongs to the copier and passes the ownership check; its state.pt is
    # still loaded without unpickling code.
    marker = tmp_path / "pwned"
    run = _run_dir(tmp_path, marker)
    check_run_dir(run)
    with pytest.raises(UnsafeCheckpointError, match="state.pt: not loaded.*posix.system"):
        asyncio.run(Checkpointer(run, every=1).restore(None, None, None))
    assert not marker.exists()


# Each way the directory a link leads to may be unsafe: (what to change, whether it needs root).
DEFECTS = {
    "the directory is another user's": (lambda run: os.chown(run, NOBODY, NOBODY), True),
    "the directory is writable by every user": (lambda run: os.chmod(run, 0o777), False),
    "a file in it is another user's": (
        lambda run: os.chown(run / "config.yaml", NOBODY, NOBODY),
        True,
    ),
    "a file in it is writable by every user": (
        lambda run: os.chmod(run / "config.yaml", 0o666),
        False,
    ),
    "the directory above it is writable by every user": (
        lambda run: os.chmod(run.parent, 0o777),
        False,
    ),
    "the directory above it is another user's": (
        lambda run: os.chown(run.parent, NOBODY, NOBODY),
        True,
    ),
}


def _linked(tmp_path, how: str):
    """A run directory reached through a link: the directory itself a link (``whole``), or
    its ``checkpoints`` a link to a directory elsewhere (``inside``); returns (the path to
    resume, the directory the link leads to)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _run_dir(elsewhere, tmp_path / "pwned")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    if how == "whole":
        os.symlink(run, mine / "run")
        return mine / "run", run
    local = _run_dir(mine, tmp_path / "pwned")
    shutil.rmtree(local / "checkpoints")
    os.symlink(run / "checkpoints", local / "checkpoints")
    return local, run


@pytest.mark.parametrize("how", ["whole", "inside"])
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_link_is_judged_by_what_it_leads_to(tmp_path, how, defect):
    change, needs_root = DEFECTS[defect]
    if needs_root and os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    resumed, target = _linked(tmp_path, how)
    assert check_run_dir(resumed) == (target if how == "whole" else resumed)  # safe: passes
    if how == "inside":
        target = target / "checkpoints"
        change = {
            "a file in it is another user's": lambda d: os.chown(d / "latest", NOBODY, NOBODY),
            "a file in it is writable by every user": lambda d: os.chmod(d / "latest", 0o666),
        }.get(defect, change)
    change(target)
    with pytest.raises(ForeignRunDirError):
        check_run_dir(target)  # unsafe on its own ...
    with pytest.raises(ForeignRunDirError, match="refused"):
        check_run_dir(resumed)  # ... and so through the link
