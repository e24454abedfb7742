"""Tensors and arrays travel through shared memory: equal, unaliased, nothing leaked."""

from __future__ import annotations

import os

import numpy as np
import torch

from controller import _serialization as ser
from controller import session_tag
from tests.integration.controller.actors import Counter, Tensors


def _shm_files() -> set[str]:
    """This session's shared-memory files (other Forge runs on the host make their own)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(session_tag())}


async def test_100mb_tensor_roundtrip_is_equal():
    m = await Tensors.as_actor()
    before = _shm_files()
    t = torch.randn(25 * 1024 * 1024)  # 100 MB of fp32
    out = await m.roundtrip.call_one(t)
    assert out.dtype == t.dtype and out.shape == t.shape
    assert torch.equal(out, t)
    assert out.data_ptr() != t.data_ptr()
    # segments are recycled, not accumulated: ownership moves with each message and a
    # freed received tensor's segment becomes a warm send segment
    del out
    for _ in range(3):
        again = await m.roundtrip.call_one(t)
        assert torch.equal(again, t)
        del again
    assert len(_shm_files() - before) <= 3


async def test_receiver_gets_its_own_tensor():
    m = await Tensors.as_actor()
    t = torch.zeros(100_000)
    out = await m.add_one.call_one(t)
    assert torch.equal(t, torch.zeros(100_000))  # the sender's tensor is untouched
    assert torch.equal(out, torch.ones(100_000))
    out += 1  # and the result is writable, owned memory
    assert float(out[0]) == 2.0


async def test_dtypes_shapes_and_layouts():
    m = await Tensors.as_actor()
    cases = {
        "bf16": torch.randn(300, 300).to(torch.bfloat16),
        "int64": torch.arange(50_000),
        "bool": torch.rand(200_000) > 0.5,
        "noncontig": torch.randn(400, 300).t(),
        "small": torch.tensor([1.0, 2.0]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    out = await m.roundtrip.call_one(cases)
    for k, v in cases.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert torch.equal(out[k], v), k
    grad = torch.randn(100_000, requires_grad=True)
    assert (await m.roundtrip.call_one(grad)).requires_grad


async def test_numpy_arrays():
    m = await Tensors.as_actor()
    a = np.random.rand(500, 300)
    out = await m.roundtrip.call_one({"a": a, "b": a[::2]})
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], a[::2])


async def test_tensor_to_many_ranks_each_gets_a_copy():
    m = await Tensors.options(procs=3).as_actor()
    t = torch.arange(100_000, dtype=torch.float64)
    sums = await m.checksum.call(t)
    assert sums.values() == [float(t.sum())] * 3


async def test_failed_pickle_leaves_no_shm():
    import threading

    before = _shm_files()
    try:
        ser.dumps([torch.randn(100_000), threading.Lock()])
    except TypeError:
        pass
    assert _shm_files() - before <= {os.path.basename(s.path) for s in ser._pool.free}


def test_session_shutdown_removes_all_shm(tmp_path):
    from tests.helpers import run_script

    out = run_script(
        tmp_path,
        """
        import os, torch
        from controller import shutdown
        from controller._runtime import get_runtime
        from tests.integration.controller.actors import Tensors
        m = Tensors.options(procs=2).as_actor().get(timeout=60)
        m.roundtrip.call(torch.randn(1_000_000)).get(timeout=60)
        print("PREFIX", get_runtime().session.shm_prefix)
        shutdown().get(timeout=30)
    """,
    )
    assert out.returncode == 0, out.stderr
    prefix = out.stdout.split("PREFIX ")[1].split()[0]
    assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] == []


async def test_small_payload_path_unchanged():
    c = await Counter.as_actor()
    assert await c.echo.call_one({"x": [1, 2, 3]}) == {"x": [1, 2, 3]}
