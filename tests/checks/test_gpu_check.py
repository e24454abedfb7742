"""Issue 35: ``scripts/gpu_check.sh`` cannot rot on a machine without GPUs. Its CPU smoke mode
runs every part (both modes, the sleep/hand-off/offload phases, the broadcast path over gloo)
on a tiny model, with the packages a bare GPU machine lacks made unimportable; without a GPU
and without ``--cpu-smoke`` it stops at once with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, script_env

# Forge's dependencies that torch, transformers and peft do not pull in.
MISSING_ON_A_BARE_GPU_MACHINE = (
    "cloudpickle",
    "uvloop",
    "rich",
    "math_verify",
    "matplotlib",
    "gguf",
    "controller",
)

BLOCKER = f"""
import sys
for name in {MISSING_ON_A_BARE_GPU_MACHINE!r}:
    sys.modules[name] = None  # import fails, importlib.util.find_spec says None: not installed
"""


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)  # loaded by every interpreter started
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"), PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=240,
    )


@pytest.mark.slow  # ~60 s on the 2-core machine: four interpreters load torch and transformers
def test_cpu_smoke_runs_every_part_with_torch_transformers_peft_only(tmp_path):
    out = _run(tmp_path, "--cpu-smoke")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m["mode"] for m in report["modes"]] == ["colocate", "split"]
    for m in report["modes"]:
        for key in (
            "step_s",
            "generate_tokens_per_s",
            "train_tokens_per_s",
            "handoff_s",
            "mismatch_kl",
            "logprob_gap",
            "memory_returns",
        ):
            assert key in m, (m["mode"], key)
        # float32 on CPU, trainer and generator on the same weights: logprobs agree closely
        assert m["mismatch_kl"] < 1e-6, m
    b = report["broadcast"]
    assert b["backend"] == "gloo" and b["matches_sender"], b


def test_without_a_gpu_it_stops_at_once_with_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = _run(tmp_path)
    assert out.returncode == 2
    assert "no GPU visible" in out.stderr and "--cpu-smoke" in out.stderr
