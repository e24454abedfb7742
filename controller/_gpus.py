"""The GPU provisioner: disjoint GPUs for meshes spawned with ``with_gpus=True``.

Each process of such a mesh gets one GPU of its own through ``CUDA_VISIBLE_DEVICES`` (so inside
it, ``cuda:0`` is its device); GPUs return to the pool when the mesh stops. The visible set is
``FORGE_VISIBLE_GPUS`` (a comma-separated list, e.g. for tests on CPU), else
``CUDA_VISIBLE_DEVICES``, else what ``nvidia-smi`` lists, else none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

from controller import env_vars


def visible_gpus() -> list[str]:
    for raw in (env_vars.visible_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES")):
        if raw is not None:
            return [d.strip() for d in raw.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


class GpuAllocator:
    """Hands out disjoint devices from ``devices``; thread-safe."""

    def __init__(self, devices: list[str]):
        self.devices = list(devices)
        self._owner: dict[str, str] = {}
        self._lock = threading.Lock()

    def allocate(self, n: int, owner: str) -> list[str]:
        """``n`` free devices for ``owner``; ``RuntimeError`` saying who holds the rest."""
        with self._lock:
            free = [d for d in self.devices if d not in self._owner]
            if len(free) < n:
                held: dict[str, list[str]] = {}
                for d, o in self._owner.items():
                    held.setdefault(o, []).append(d)
                raise RuntimeError(
                    f"{owner} asks for {n} GPU(s) but only {len(free)} of "
                    f"{len(self.devices)} are free (visible: {self.devices}; held: {held}). "
                    "Lower procs/num_replicas, stop other meshes, or set CUDA_VISIBLE_DEVICES."
                )
            got = free[:n]
            for d in got:
                self._owner[d] = owner
            return got

    def release(self, owner: str) -> None:
        with self._lock:
            for d in [d for d, o in self._owner.items() if o == owner]:
                del self._owner[d]

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return dict(self._owner)


_allocator: GpuAllocator | None = None


def get_allocator() -> GpuAllocator:
    global _allocator
    if _allocator is None:
        _allocator = GpuAllocator(visible_gpus())
    return _allocator


def reset_allocator() -> None:
    """Forget the pool (tests change ``FORGE_VISIBLE_GPUS``)."""
    global _allocator
    _allocator = None
