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
    """Configs keep ``auto`` (``forge config show`` shows it); ``with_precision``, which each
    role calls in its own process, decides it for that process's device."""
    t = TrainerConfig(
        model="m", device="cpu", autocast="auto", autocast_head=True, weights={"dtype": "auto"}
    )
    g = GeneratorConfig(model="m", dtype="auto")
    assert (t.autocast, t.autocast_head, t.weights.dtype, g.dtype) == ("auto", True, "auto", "auto")
    t, g = t.with_precision(), g.with_precision()
    if native:
        assert (t.autocast, t.autocast_head, t.weights.dtype) == ("bfloat16", True, "bfloat16")
        assert g.dtype == "bfloat16"
    else:  # all float32: no autocast, no bf16 head, pushes as the parameters are held
        assert (t.autocast, t.autocast_head, t.weights.dtype) == (None, False, "")
        assert g.dtype == "float32"
    assert t.with_precision() is t and g.with_precision() is g  # nothing left to decide


def test_forge_cpu_bf16_overrides_the_probe(monkeypatch):
    for value, native in (("1", True), ("0", False)):
        monkeypatch.setenv("FORGE_CPU_BF16", value)
        assert precision.cpu_bf16() is native
        assert precision.auto_dtype("cpu") == ("bfloat16" if native else "float32")
    monkeypatch.setenv("FORGE_CPU_BF16", "yes")
    with pytest.raises(ValueError, match="FORGE_CPU_BF16 must be 0 or 1"):
        precision.cpu_bf16()
    monkeypatch.delenv("FORGE_CPU_BF16")
    assert precision.cpu_bf16() is precision._probe_cpu_bf16()


def test_the_decision_names_the_process_that_made_it(monkeypatch, capsys):
    import os
    import socket

    monkeypatch.setattr(precision, "_told", set())
    monkeypatch.setenv("FORGE_CPU_BF16", "1")
    GeneratorConfig(model="m", dtype="auto").with_precision()
    err = capsys.readouterr().err
    assert "generator.dtype: auto -> bfloat16" in err and "per FORGE_CPU_BF16" in err
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in err


def test_explicit_bf16_without_native_bf16_warns(native):
    if native:
        TrainerConfig(model="m", device="cpu", autocast="bfloat16")  # no warning
        return
    with pytest.warns(UserWarning, match="trainer.autocast=bfloat16 on this CPU"):
        TrainerConfig(model="m", device="cpu", autocast="bfloat16")
    with pytest.warns(UserWarning, match="generator.dtype=bfloat16"):
        GeneratorConfig(model="m", dtype="bfloat16")


def test_main_job_config_is_consistent_either_way(native):
    """The main job's config keeps ``auto``; decided on one kind of host, its pushes and its
    generator agree on the type."""
    from forge.launch import load_app

    rl = load_app(MAIN_YAML, ["base_model=/nonexistent-model-dir", "rl.policy.model=m"])[1].rl
    assert (rl.generator.dtype, rl.trainer.autocast, rl.trainer.weights.dtype) == ("auto",) * 3
    dtype = "bfloat16" if native else "float32"
    trainer = rl.trainer.with_precision()
    assert rl.generator.with_precision().dtype == dtype
    assert trainer.autocast == (dtype if native else None)
    assert trainer.weights.dtype == ("bfloat16" if native else "")


def test_an_auto_push_with_a_puller_fixed_to_another_type_is_an_error():
    """``trainer.weights.dtype: auto`` pushes bf16 where the trainer's host has it natively: a
    generator fixed to float32 would compute with rounded weights there, so the config says
    so when it loads, whatever this machine's CPU."""
    from forge.launch import load_app

    args = ["base_model=/nonexistent-model-dir", "rl.policy.model=m"]
    with pytest.raises(ValueError, match="trainer.weights.dtype=auto pushes bfloat16"):
        load_app(MAIN_YAML, [*args, "rl.generator.dtype=float32"])
    load_app(MAIN_YAML, [*args, "rl.generator.dtype=bfloat16"])  # what auto pushes there


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


def test_config_show_keeps_auto_for_the_roles_to_decide(native, capsys):
    """``forge config show`` prints ``auto`` (each role decides at its start, on its own
    host), not a guess made on the machine that shows the config."""
    import yaml

    from forge.cli import main

    assert main(["config", "show", str(MAIN_YAML)]) == 0
    rl = yaml.safe_load(capsys.readouterr().out)["rl"]
    assert rl["generator"]["dtype"] == "auto"
    assert rl["trainer"]["autocast"] == rl["trainer"]["weights"]["dtype"] == "auto"
