"""How a run's actor processes are started: their environment (torch threads, quiet
downloads)."""

from __future__ import annotations

__all__ = ["actor_env"]


def actor_env(threads: int) -> dict[str, str]:
    """Environment for a run's actor processes: no download progress bars, and their torch
    threads. ``threads=0`` (the default of the apps' ``threads_per_actor``): the host's thread
    budget (``controller.threads``) hands cores to whichever components are computing, one
    thread at rest. ``threads=N``: a fixed N threads per process, budget off."""
    if threads < 0:
        raise ValueError(f"threads_per_actor must be >= 0 (0: thread budget), got {threads}")
    return {
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "OMP_NUM_THREADS": str(threads or 1),
        "FORGE_THREAD_BUDGET": "0" if threads else "1",
    }
