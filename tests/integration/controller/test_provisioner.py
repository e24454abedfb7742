"""GPU provisioning (with a fake device list on CPU) and torch.distributed rendezvous."""

from __future__ import annotations

import pytest

from controller import Actor, endpoint
from controller._gpus import GpuAllocator, reset_allocator


class Env(Actor):
    @endpoint
    def cuda_visible(self) -> str | None:
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES")

    @endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t.item())


def test_allocator_is_disjoint_and_explains_shortage():
    a = GpuAllocator(["0", "1", "2", "3"])
    assert a.allocate(2, "gen") == ["0", "1"]
    assert a.allocate(1, "trainer") == ["2"]
    with pytest.raises(RuntimeError, match=r"asks for 2 GPU\(s\) but only 1 of 4 are free.*gen"):
        a.allocate(2, "ref")
    a.release("gen")
    assert a.allocate(3, "ref") == ["0", "1", "3"]


async def test_with_gpus_gives_each_rank_its_own_device(monkeypatch):
    monkeypatch.setenv("FORGE_VISIBLE_GPUS", "0,1,2")
    reset_allocator()
    try:
        m = await Env.options(procs=2, with_gpus=True).as_actor()
        assert (await m.cuda_visible.call()).values() == ["0", "1"]
        with pytest.raises(RuntimeError, match="only 1 of 3 are free"):
            await Env.options(procs=2, with_gpus=True).as_actor()
        await m.shutdown()  # releases its GPUs
        m2 = await Env.options(procs=3, with_gpus=True).as_actor()
        assert sorted((await m2.cuda_visible.call()).values()) == ["0", "1", "2"]
    finally:
        reset_allocator()


async def test_two_rank_mesh_runs_gloo_all_reduce():
    m = await Env.options(procs=2).as_actor()
    assert (await m.all_reduce.call(1.5)).values() == [3.0, 3.0]
