"""The multi-rank trainer's own rendezvous store (``forge.training.parallel.init_distributed``),
seen from another process on the host: it listens on ``MASTER_ADDR`` only (the loopback on one
host), so a connection to another address of the host is refused. torch's ``env://`` store
listens on every interface whatever address it is given. Two real gloo ranks; the other
address is 127.0.0.2, which reaches a socket listening on every interface and no other."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from controller import Actor, endpoint
from tests.integration.hostile.test_runtime_weight_store import _listening


class Rank(Actor):
    @endpoint
    def join(self) -> dict:
        from forge.training.parallel import init_distributed

        init_distributed(2, "cpu")
        total = torch.ones(1)
        dist.all_reduce(total)
        return {"sum": total.item(), "port": int(os.environ["MASTER_PORT"])}


def _connects(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


async def test_the_trainers_store_listens_on_its_address_only():
    ranks = await Rank.options(procs=2, env_vars={"FORGE_PRELOAD": "torch"}).as_actor()
    joined = list((await ranks.join.call(timeout=120)).values())
    assert [j["sum"] for j in joined] == [2.0, 2.0]  # the group works
    port = joined[0]["port"]
    assert _listening(port) == [("tcp", "0100007F")]  # 127.0.0.1, nothing else
    assert _connects("127.0.0.1", port)  # reachable where it listens ...
    assert not _connects("127.0.0.2", port)  # ... and on no other address
