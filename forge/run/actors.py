"""How a run's actor processes are started: their environment variables (torch threads, quiet
downloads, deterministic kernels), given to ``.options(env_vars=...)``."""

from __future__ import annotations

from forge.actors.forge_actor import MODEL_PRELOAD

__all__ = ["actor_env_vars", "prefork_actor_zygote"]


def actor_env_vars(threads: int, deterministic: bool = False) -> dict[str, str]:
    """Environment variables of a run's actor processes: no download progress bars, and their
    torch threads. ``threads=0`` (the default of the apps' ``threads_per_actor``): the host's
    thread budget (``controller.threads``) hands cores to whichever components are computing,
    one thread at rest. ``threads=N``: a fixed N threads per process, budget off.
    ``deterministic``: fixed threads (``threads`` must be > 0), torch's deterministic kernels
    (``forge.actors.forge_actor.use_deterministic_kernels``) and a fixed hash seed in every
    actor process."""
    if threads < 0:
        raise ValueError(f"threads_per_actor must be >= 0 (0: thread budget), got {threads}")
    if deterministic and not threads:
        raise ValueError("deterministic runs need a fixed thread count: threads_per_actor > 0")
    extra = (
        {"FORGE_DETERMINISTIC": "1", "PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        if deterministic
        else {}
    )
    return {
        **extra,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "OMP_NUM_THREADS": str(threads or 1),
        "FORGE_THREAD_BUDGET": "0" if threads else "1",
        # Every role imports these: its processes fork from a zygote that has (controller._zygote)
        "FORGE_PRELOAD": MODEL_PRELOAD,
    }


def prefork_actor_zygote(threads: int = 0, deterministic: bool = False) -> bool:
    """Fork the zygote of actors started with ``actor_env_vars(threads, deterministic)`` from
    this process now (``controller._prefork``): for a command (``forge run``, ``forge eval``)
    that has imported its app and starts no thread before it spawns. Whether it did; settings
    ``actor_env_vars`` rejects are left to the app, which names them."""
    from controller._prefork import prefork

    try:
        env = actor_env_vars(threads, deterministic)
    except ValueError:
        return False
    return prefork(env)
