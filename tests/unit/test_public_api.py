"""``forge`` exposes its public names lazily; every one of them resolves."""

from __future__ import annotations

import subprocess
import sys

import forge
from tests.helpers import REPO, script_env


def test_every_public_name_resolves():
    import importlib.util

    for name in forge.__all__:
        module = forge._EXPORTS[name]
        if module == "forge.actors.trainer" and importlib.util.find_spec(module) is None:
            continue
        assert getattr(forge, name) is not None, name


def test_import_forge_is_light():
    code = "import sys, forge; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr
