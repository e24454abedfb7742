"""The Python sandbox checks its limits before it starts anything (what it runs:
tests/integration/components/test_sandbox.py)."""

from __future__ import annotations

import pytest

from forge.envs import run_python


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="timeout_s, memory_mb and max_output_chars"):
        run_python("print(1)", timeout_s=0)
