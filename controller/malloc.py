"""glibc malloc settings for actor processes: keep freed memory for reuse instead of page
faults.

A training step on CPU allocates and frees gigabytes of activations, gradients and logits.
glibc's defaults serve every allocation above 32 MB (and, in a thread other than the main
one, above 64 MB) with a fresh ``mmap`` and give it back with ``munmap`` when freed, and trim
the heap's free top back to the OS. Every step then touches its memory for the first time
again: a real model's trainer then spends a large share of its CPU in the kernel, faulting
pages in (docs/performance.md, "Page faults").

These settings make an actor process's heap keep what it frees, so the next step reuses it
without a fault:

- ``glibc.malloc.mmap_max=0``: every allocation comes from the heap, none from its own mmap;
- ``glibc.malloc.arena_max=1``: every thread allocates from the main heap (an actor's
  endpoints run in a worker thread, whose own arenas would mmap anything above 64 MB);
- ``glibc.malloc.trim_threshold``: 64 TiB, i.e. freed memory is never handed back.

The price: a process keeps its peak heap resident until it exits (the gen-heavy trainer
13.4 GB against 10.8-12.7 GB moving between steps without them). ``FORGE_MALLOC=0`` leaves
glibc's defaults. They take effect only at a process's start (glibc reads ``GLIBC_TUNABLES``
once), so ``controller._local.worker_env`` puts them in every actor process's environment,
and ``forge run`` / ``forge eval`` start themselves again with them (``reexec_tuned``) so that
the actors' zygote forked from the command (``controller._prefork``) has them too. A value the
user set in ``GLIBC_TUNABLES`` for one of these names wins. Other C libraries (musl) and other
systems: nothing is set.
"""

from __future__ import annotations

import os
import platform
import sys

from controller import env_vars

__all__ = ["TUNABLES", "reexec_tuned", "tuned_env"]

TUNABLES = (
    ("glibc.malloc.mmap_max", "0"),
    ("glibc.malloc.arena_max", "1"),
    ("glibc.malloc.trim_threshold", str(1 << 46)),
)
NAME = "GLIBC_TUNABLES"


def _glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def tuned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``TUNABLES`` merged into its ``GLIBC_TUNABLES`` (names already there keep
    their values); ``env`` unchanged when ``FORGE_MALLOC`` in ``env`` is ``0`` or this is not glibc on Linux. Merging twice gives the same string."""
    if not env_vars.malloc_tuning(env) or not _glibc():
        return env
    have = env.get(NAME, "")
    names = {item.split("=", 1)[0] for item in have.split(":") if item}
    extra = [f"{k}={v}" for k, v in TUNABLES if k not in names]
    if not extra:
        return env
    return {**env, NAME: ":".join(filter(None, [have, *extra]))}


def reexec_tuned() -> None:
    """Start this command again (same pid, ``os.execve``) with ``tuned_env`` when this
    process lacks it, so that what it forks has the settings; returns when nothing is to be
    done or the exec is impossible (no ``sys.orig_argv``)."""
    env = tuned_env(dict(os.environ))
    argv = getattr(sys, "orig_argv", None)
    if env.get(NAME) == os.environ.get(NAME) or not argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError:  # could not exec: run on as this process, with glibc's defaults
        return
