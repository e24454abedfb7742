"""The stale-session sweep removes only what Forge marked as its own: a session directory of
this host's dead controller that holds Forge's mark (``SESSION_MARK``, naming it), whatever
else carries a Forge-like name; and never files named after another host's controller (a copy
a worker made here) for a pid that is dead *here*."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller import _runtime

DEAD_PID = 4_000_000  # above pid_max: never alive
NOBODY = 65534


def _mark(d, content: str | None = None) -> None:
    (d / _runtime.SESSION_MARK).write_text(d.name if content is None else content)


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(_runtime.ser, "SHM_DIR", None)
    return tmp_path


def test_sweep_removes_this_hosts_dead_marked_sessions_only(tmp):
    me = _runtime.host_id()
    other = "0badc0de" if me != "0badc0de" else "0ddba11a"
    ours_dead = tmp / f"forge-{DEAD_PID}-{me}-abcd1234"
    theirs = tmp / f"forge-{DEAD_PID}-{other}-abcd1234"
    weights = tmp / f"forge-w-forge-{DEAD_PID}-{other}-abcd1234-policy-v3"
    ours_alive = tmp / f"forge-1-{me}-abcd1234"  # pid 1 is alive
    legacy = tmp / f"forge-{DEAD_PID}-training"  # a name of Forge's old shape, not Forge's
    unmarked = tmp / f"forge-{DEAD_PID}-{me}-results1"  # Forge's shape, no mark
    for d in (ours_dead, theirs, ours_alive, legacy, unmarked):
        d.mkdir()
        if d not in (legacy, unmarked):
            _mark(d)
    weights.write_bytes(b"w")
    _runtime._sweep_stale_sessions(str(tmp))
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        p.name for p in (theirs, weights, ours_alive, legacy, unmarked)
    )


def test_a_session_directory_forge_made_is_swept_once_its_controller_is_dead(tmp, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(os, "getpid", lambda: DEAD_PID)
    d = _runtime.make_session_dir()
    monkeypatch.undo()
    with open(os.path.join(d, _runtime.SESSION_MARK)) as mark:
        assert mark.read() == os.path.basename(d)
    assert oct(os.stat(d).st_mode & 0o777) == oct(0o700)
    _runtime._sweep_stale_sessions(str(tmp))
    assert not os.path.exists(d)


names = st.one_of(
    st.from_regex(r"forge-4000000-[0-9a-f]{8}-[a-z0-9_]{8}", fullmatch=True),
    st.from_regex(r"forge-4000000-[a-z0-9_]{8}", fullmatch=True),  # the old shape
    st.from_regex(r"forge-4000000-[a-z0-9_-]{1,20}", fullmatch=True),
    st.text(st.sampled_from("forge-0123456789abcdef_"), min_size=1, max_size=30),
).filter(lambda n: n not in (".", "..") and "/" not in n)
marks = st.sampled_from(["right", "none", "wrong text", "a directory", "a link", "foreign"])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(dirs=st.dictionaries(names, marks, min_size=1, max_size=6), use_host=st.booleans())
def test_no_directory_without_forges_mark_is_ever_removed(tmp_path_factory, dirs, use_host):
    tmp = tmp_path_factory.mktemp("sweep")
    me = _runtime.host_id()
    made = {}  # directory name -> its mark
    for name, mark in dirs.items():
        if use_host:  # names of this host's shape, so that only the mark tells them apart
            name = name.replace("forge-4000000-", f"forge-4000000-{me}-", 1)
        if name in made:
            continue
        made[name] = mark = "none" if mark == "foreign" and os.geteuid() != 0 else mark
        d = tmp / name
        d.mkdir()
        (d / "data").write_text("keep me")
        if mark in ("right", "foreign"):
            _mark(d)
        if mark == "foreign":
            os.chown(d / _runtime.SESSION_MARK, NOBODY, NOBODY)
        elif mark == "wrong text":
            _mark(d, "forge-1-0-x")
        elif mark == "a directory":
            (d / _runtime.SESSION_MARK).mkdir()
        elif mark == "a link":  # a link to a file holding the right text
            target = tmp_path_factory.mktemp("elsewhere") / "mark"
            target.write_text(name)
            os.symlink(target, d / _runtime.SESSION_MARK)
    _runtime._sweep_stale_sessions(str(tmp))
    left = {p.name for p in tmp.iterdir()}
    for name, mark in made.items():
        if mark != "right":
            assert name in left, f"{name} ({mark}) was removed"
        elif _runtime._SESSION_DIR.match(name) and use_host:
            assert name not in left, f"{name}, marked, of a dead controller, was kept"


def test_session_names_carry_the_host_id():
    assert len(_runtime.host_id()) == 8
    int(_runtime.host_id(), 16)
