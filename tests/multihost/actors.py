"""Actors used by the multihost tests (importable, so they pickle by reference)."""

from __future__ import annotations

import os
import socket

from controller import Actor, endpoint


class Where(Actor):
    """Says where it runs; sums across ranks with torch.distributed (gloo) over TCP."""

    @endpoint
    async def where(self) -> dict:
        return {"pid": os.getpid(), "master": os.environ.get("MASTER_ADDR"), "ip": _host_ip()}

    @endpoint
    async def call_other(self, other, x):
        """Call another actor (possibly on another host) from this one."""
        return await other.where.call_one(), x

    @endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t.item())


def _host_ip() -> str:
    """The address this process's host routes to the bridge with (its "host address")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.77.0.1", 9))
        return s.getsockname()[0]
