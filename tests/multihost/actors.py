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


class Relayer(Actor):
    """Pushes a weight version (``shm`` transport) or copies one to its own host
    (``forge.weights.relay.localize``); says how many bytes of a file it served to peers."""

    def __init__(self):
        self.transport = None

    @endpoint
    def push(self, version: int, mb: int):
        import torch

        from forge.weights.shm import SharedMemoryTransport

        if self.transport is None:
            self.transport = SharedMemoryTransport(f"relay-test-{os.getpid()}", spares=0)
        n = mb * (1 << 20) // 4
        g = torch.Generator().manual_seed(version)
        state = {"a": torch.randn(n // 2, generator=g), "b": torch.randn(n - n // 2, generator=g)}
        return self.transport.push(state, version)

    @endpoint
    async def pull(self, handle) -> dict:
        import hashlib
        import time

        from forge.weights.relay import localize

        t0 = time.perf_counter()
        local = await localize(handle)
        took = time.perf_counter() - t0
        with open(local.location, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        from controller import files

        how = files.relayed.get(local.location, {})
        return {"path": local.location, "sha": digest, "s": took, "ip": _host_ip(), **how}

    @endpoint
    def sha(self, path: str) -> str:
        import hashlib

        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    @endpoint
    def file_size(self, path: str) -> int:
        return os.path.getsize(path)

    @endpoint
    def served(self, path: str) -> int:
        from controller import files

        return files.served_bytes(path)

    @endpoint
    async def received(self, handle) -> int:
        """Bytes of ``handle``'s copy this host has without a gap so far (0 before it starts)."""
        from controller import _published
        from forge.weights.relay import _local_path

        g = _published._growing.get(_local_path(handle))
        return g.ready if g is not None else 0

    @endpoint
    def where(self) -> dict:
        return {"pid": os.getpid(), "ip": _host_ip()}
