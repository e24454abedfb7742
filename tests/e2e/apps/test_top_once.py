"""``forge top --once`` from the command line, in a real process: it prints one frame of a
status file and reports a bad run directory plainly (no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO, script_env
from tests.unit.test_status_top import status_snapshot


def _forge_top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", "top", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=script_env(COLUMNS="160"),
        timeout=60,
    )


def test_forge_top_once_prints_a_frame_and_errors_plainly(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps(status_snapshot(state="finished")))
    out = _forge_top(str(tmp_path), "--once")
    assert out.returncode == 0, out.stderr
    assert "FINISHED" in out.stdout and "generator r1 v43" in out.stdout
    bad = _forge_top(str(tmp_path / "nope"), "--once")
    assert bad.returncode == 2 and "forge top: error:" in bad.stderr
    assert "Traceback" not in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _forge_top(str(empty), "--once")
    assert out.returncode == 2 and "no status file yet" in out.stderr
