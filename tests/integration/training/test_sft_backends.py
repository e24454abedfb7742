"""The same SFT config and seed give the same numbers on one host and on Ray.

The SFT stage's data order, seed and thread count do not depend on where its trainer runs:
its per-step losses on the local backend equal those on a Ray instance bit for bit (2-core
machine: 30 steps, and the demo's 250 on three simulated hosts, docs/multihost.md). What a
run starts from does: ``build_fingerprint`` names a cached base model by what decides its
bytes, so a stale build is never reused where a fresh cache would build another.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forge.run.pipeline import build_fingerprint
from tests.helpers import REPO, script_env


def _sft_losses(tmp_path: Path, model: str, backend: str) -> list[float]:
    run = tmp_path / backend
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            str(REPO / "apps/sft/configs/sumdigits.yaml"),
            "--run-dir",
            str(run),
            f"policy.model={model}",
            "steps=6",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=script_env(FORGE_BACKEND=backend),
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["sft/loss"] for r in rows if "sft/loss" in r]


@pytest.mark.slow
@pytest.mark.ray
def test_sft_losses_on_ray_equal_the_local_backends(tmp_path):
    pytest.importorskip("ray", reason="needs ray (pip install 'forge[ray]')")
    from forge.models import make_tiny_model

    model = str(make_tiny_model(tmp_path / "mini", preset="mini", seed=0))
    local = _sft_losses(tmp_path, model, "local")
    assert len(local) == 6 and local[-1] < local[0]
    assert _sft_losses(tmp_path, model, "ray") == local


def test_a_base_model_is_cached_under_what_decides_its_bytes():
    """Another CPU kernel set (ATen's DEFAULT against this machine's vector kernels) or
    another tokenizer corpus names another cached model."""
    import torch

    here = build_fingerprint()
    assert build_fingerprint() == here and build_fingerprint(["a b"]) != here
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this machine runs ATen's DEFAULT kernels already")
    code = "from forge.run.pipeline import build_fingerprint; print(build_fingerprint())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=script_env(ATEN_CPU_CAPABILITY="default"),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() != here
