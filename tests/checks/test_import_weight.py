"""What starting Forge costs, measured in a fresh interpreter: ``import controller`` loads
neither torch nor numpy, ``import forge`` and ``forge --help`` load no torch, and the help
answers fast."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.helpers import REPO, script_env


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=60,
    )


def test_help_is_fast_and_light():
    t = time.monotonic()
    out = _python("-m", "forge.cli", "--help")
    assert out.returncode == 0 and "make-tiny-model" in out.stdout
    assert time.monotonic() - t < 5
    out = _python("-c", "import sys, forge.cli; print('torch' in sys.modules)")
    assert out.stdout.strip() == "False", out.stderr


def test_import_forge_is_light():
    out = _python("-c", "import sys, forge; print('torch' in sys.modules)")
    assert out.stdout.strip() == "False", out.stderr


def test_import_controller_does_not_import_torch():
    code = "import sys, controller; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
