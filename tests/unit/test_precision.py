"""``auto`` precision: bf16 only where the device multiplies it natively (forge.models.precision)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from forge.generation.backend import GeneratorConfig
from forge.models import precision
from forge.training.trainer_config import TrainerConfig

MAIN_YAML = Path(__file__).resolve().parents[2] / "apps" / "arith" / "smollm2.yaml"

# Abbreviated /proc/cpuinfo lines of the machines this project ran on.
SAPPHIRE_RAPIDS = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC_ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
NEOVERSE_V1 = "Features\t: fp asimd sve bf16 i8mm\n"


def test_cpuinfo_flags():
    assert precision.cpuinfo_bf16(SAPPHIRE_RAPIDS, "x86_64")
    assert not precision.cpuinfo_bf16(EPYC_ZEN3, "x86_64")
    assert precision.cpuinfo_bf16(NEOVERSE_V1, "aarch64")
    assert not precision.cpuinfo_bf16(NEOVERSE_V1, "x86_64")  # "bf16" is Arm's name only
    assert not precision.cpuinfo_bf16("", "x86_64")


@pytest.fixture(params=[True, False], ids=["native-bf16", "no-bf16"])
def native(request, monkeypatch) -> bool:
    """The CPU has native bf16 (or not), whatever this machine's is."""
    monkeypatch.setattr(precision, "cpu_bf16", lambda: request.param)
    return request.param


def test_auto_resolves_on_the_device(native):
    t = TrainerConfig(
        model="m", device="cpu", autocast="auto", autocast_head=True, weights={"dtype": "auto"}
    )
    g = GeneratorConfig(model="m", dtype="auto")
    if native:
        assert (t.autocast, t.autocast_head, t.weights.dtype) == ("bfloat16", True, "bfloat16")
        assert g.dtype == "bfloat16"
    else:  # all float32: no autocast, no bf16 head, pushes as the parameters are held
        assert (t.autocast, t.autocast_head, t.weights.dtype) == (None, False, "")
        assert g.dtype == "float32"


def test_explicit_bf16_without_native_bf16_warns(native):
    if native:
        TrainerConfig(model="m", device="cpu", autocast="bfloat16")  # no warning
        return
    with pytest.warns(UserWarning, match="trainer.autocast=bfloat16 on this CPU"):
        TrainerConfig(model="m", device="cpu", autocast="bfloat16")
    with pytest.warns(UserWarning, match="generator.dtype=bfloat16"):
        GeneratorConfig(model="m", dtype="bfloat16")


def test_main_job_config_is_consistent_either_way(native):
    """The main job's pushes and its generator agree on the type (the push-dtype check)."""
    from forge.launch import load_app

    rl = load_app(MAIN_YAML, ["base_model=/nonexistent-model-dir", "rl.policy.model=m"])[1].rl
    dtype = "bfloat16" if native else "float32"
    assert rl.generator.dtype == dtype
    assert rl.trainer.autocast == (dtype if native else None)
    assert rl.trainer.weights.dtype == ("bfloat16" if native else "")


def test_unknown_value_is_an_error():
    with pytest.raises(ValueError, match="autocast"):
        TrainerConfig(model="m", autocast="bf16")


def test_configs_whose_device_is_not_here_are_not_judged(native):
    """vLLM picks its own kernels, and a GPU trainer loaded on a CPU host is judged where it
    runs: an explicit bf16 there is no warning."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GeneratorConfig(model="m", backend="vllm", dtype="bfloat16")
        if not torch.cuda.is_available():
            TrainerConfig(model="m", device="cuda", autocast="bfloat16")
