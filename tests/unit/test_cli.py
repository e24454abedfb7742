"""The ``forge`` command line answers fast and builds tiny models."""

from __future__ import annotations

import subprocess
import sys
import time

from transformers import AutoConfig

from forge.cli import main
from tests.helpers import REPO, script_env


def test_help_is_fast_and_light():
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "forge.cli", "--help"],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0 and "make-tiny-model" in out.stdout
    assert time.monotonic() - t < 5
    code = "import sys, forge.cli; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.strip() == "False"


def test_make_tiny_model(tmp_path, capsys):
    assert main(["make-tiny-model", str(tmp_path / "m")]) == 0
    assert "written to" in capsys.readouterr().out
    assert AutoConfig.from_pretrained(tmp_path / "m").model_type == "qwen2"
