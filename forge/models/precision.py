"""Where bf16 is fast, and what the ``auto`` precision knobs become.

bf16 pays only where the hardware multiplies bf16 natively: a CUDA GPU that supports it, or an
x86 CPU with AMX-BF16 or AVX512-BF16 (an Arm CPU with the ``bf16`` feature). Elsewhere torch
falls back to emulated paths, much slower than float32 (a CPU with AVX2 only: the figures
are in docs/benchmarks.md), and a run configured for bf16 there takes many times longer. So
the main job's configs say ``auto``:

- ``generator.dtype: auto``: ``bfloat16`` where the generator's device has native bf16, else
  ``float32``;
- ``trainer.autocast: auto``: ``bfloat16`` mixed precision there, else none (all float32);
- ``trainer.weights.dtype: auto``: pushes in ``bfloat16`` there, else in the parameters' type.

``auto`` is decided by each role in its own process, for the device it runs on, when it
starts (``TrainerConfig.with_precision`` in the trainer, ``GeneratorConfig.with_precision`` in
each generator replica), and each decision is printed there once per process with the host
and pid (``[forge] trainer.autocast: auto -> bfloat16 (cpu of host h1, pid 123: native
bf16)``): on a cluster whose hosts differ, each role computes in what its own host does
natively. ``forge config show`` and a run's resolved config keep ``auto``. Pushed weights of
another type than a puller's are cast on load (``trainer.weights.dtype: auto`` follows the
trainer's host; a generator on a host without native bf16 computes in float32 with the
bf16-rounded values). An explicit ``bfloat16`` on a device without native bf16 is kept, with
a warning that names the cost.

``FORGE_CPU_BF16=1`` / ``0`` (``controller.env_vars``) overrides the CPU probe of the process
that reads it: a way to test the decision per process, or to force a role's choice on a CPU
whose flags mislead.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
import warnings
from pathlib import Path

from controller import env_vars

__all__ = ["auto_dtype", "native_bf16", "resolve_auto", "resolve_device", "warn_if_slow_bf16"]

_X86_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16() -> bool:
    """This CPU multiplies bf16 natively: ``FORGE_CPU_BF16`` (``1``/``0``) where set, else
    the Linux ``/proc/cpuinfo`` flags (``False`` where they cannot be read)."""
    forced = env_vars.cpu_bf16()
    return _probe_cpu_bf16() if forced is None else forced


@functools.cache
def _probe_cpu_bf16() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return cpuinfo_bf16(text, platform.machine())


def cpuinfo_bf16(cpuinfo: str, machine: str) -> bool:
    """``cpuinfo`` (the text of ``/proc/cpuinfo``) names a native bf16 feature: x86
    ``amx_bf16`` / ``avx512_bf16``, or Arm's ``bf16`` on an ``aarch64`` ``machine``."""
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    arm = machine.lower() in ("aarch64", "arm64")
    return any(f in flags for f in _X86_FLAGS) or (arm and "bf16" in flags)


def native_bf16(device: str) -> bool:
    """``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``) computes bf16 natively."""
    import torch

    device = resolve_device(device)
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device == "cpu" and cpu_bf16()


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(device: str) -> str:
    """``bfloat16`` where ``device`` has native bf16, else ``float32``."""
    return "bfloat16" if native_bf16(device) else "float32"


def warn_if_slow_bf16(knob: str, dtype: str | None, device: str) -> None:
    """Warn when ``knob`` asks for bf16 on a ``device`` without native bf16."""
    if dtype != "bfloat16":
        return
    import torch

    device = resolve_device(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        return  # a GPU config loaded on a host without one: nothing to judge here
    if not native_bf16(device):
        where = "this CPU (no AMX-BF16 or AVX512-BF16)" if device == "cpu" else device
        warnings.warn(
            f"{knob}=bfloat16 on {where}: bf16 matmuls fall back to a slow path there "
            "(~100x slower than float32 on an AVX2 CPU); set it to auto (float32 here) unless "
            "you mean to test bf16 numerics",
            stacklevel=3,
        )


_told: set[tuple[str, str]] = set()


def resolve_auto(knob: str, value: str | None, device: str, warn: bool = True) -> str | None:
    """``value`` with ``auto`` replaced by ``auto_dtype(device)``, decided in and for the
    calling process (said once per process on stderr, with its host and pid); an explicit
    ``bfloat16`` is kept, with ``warn_if_slow_bf16`` (unless ``warn`` is off)."""
    if value != "auto":
        if warn:
            warn_if_slow_bf16(knob, value, device)
        return value
    dtype = auto_dtype(device)
    if (knob, dtype) not in _told:
        _told.add((knob, dtype))
        why = "native bf16" if dtype == "bfloat16" else "no native bf16"
        if env_vars.cpu_bf16() is not None and resolve_device(device) == "cpu":
            why += " per FORGE_CPU_BF16"
        where = f"{resolve_device(device)} of host {socket.gethostname()}, pid {os.getpid()}"
        print(f"[forge] {knob}: auto -> {dtype} ({where}: {why})", file=sys.stderr, flush=True)
    return dtype
