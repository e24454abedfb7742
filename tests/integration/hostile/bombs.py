"""Targets for ``forge.rewards.bounded`` children in tests/integration/hostile: work that never ends in
C code (no signal interrupts it), memory bombs and crashes."""

from __future__ import annotations

import os


def c_loop(item: int) -> int:
    """``item`` < 0: a big-integer power that runs for hours holding the GIL; else ``item``."""
    if item < 0:
        return 9 ** (9**12) % 7
    return item


def eat_memory(item: int) -> int:
    """``item`` < 0: allocate 64 GiB (MemoryError under the child's address-space limit)."""
    if item < 0:
        return len(bytearray(64 << 30))
    return item


def chatty(item: int) -> int:
    """Prints before answering (the protocol must not see it)."""
    print("noise", item, flush=True)
    return item


def die(item: int) -> int:
    """``item`` < 0: the process exits at once, as if OOM-killed."""
    if item < 0:
        os._exit(3)
    return item
