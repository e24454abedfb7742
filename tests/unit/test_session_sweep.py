"""The stale-session sweep judges only this host's names: a file named after another host's
controller (a copy a worker made here) is never removed for a pid that is dead *here*."""

from __future__ import annotations

from controller import _runtime

DEAD_PID = 4_000_000  # above pid_max: never alive


def test_sweep_removes_this_hosts_dead_sessions_only(tmp_path, monkeypatch):
    monkeypatch.setattr(_runtime.ser, "SHM_DIR", None)
    me = _runtime.host_id()
    other = "0badc0de" if me != "0badc0de" else "0ddba11a"
    ours_dead = tmp_path / f"forge-{DEAD_PID}-{me}-abcd1234"
    theirs = tmp_path / f"forge-{DEAD_PID}-{other}-abcd1234"
    weights = tmp_path / f"forge-w-forge-{DEAD_PID}-{other}-abcd1234-policy-v3"
    ours_alive = tmp_path / f"forge-1-{me}-abcd1234"  # pid 1 is alive
    legacy_dead = tmp_path / f"forge-{DEAD_PID}-xyz_ab12"  # a name from before host ids
    for d in (ours_dead, theirs, ours_alive, legacy_dead):
        d.mkdir()
    weights.write_bytes(b"w")
    _runtime._sweep_stale_sessions(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (theirs, weights, ours_alive)
    )


def test_session_names_carry_the_host_id():
    assert len(_runtime.host_id()) == 8
    int(_runtime.host_id(), 16)
