"""The ``broadcast`` weight transport's group (``forge.weights.group``): a trainer-side sender
and receivers in separate processes, over gloo (the NCCL path is the same code on GPUs)."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch

from forge.weights import WeightTransportConfig, build_transport, pull_handle
from forge.weights.broadcast import read_broadcast
from forge.weights.group import GroupSpec

CTX = mp.get_context("spawn")


def _receive(url: str, handle, out) -> None:
    try:
        import dataclasses

        h = dataclasses.replace(handle, location=url)
        into = {
            n: torch.zeros(m.shape, dtype=getattr(torch, m.dtype)) for n, m in h.manifest.items()
        }
        got = read_broadcast(h, into)
        out.put(pickle.dumps(got))  # plain bytes: no shared memory left behind the process
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out.put(repr(e))


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed.weight": torch.randn(300, 64, generator=g),
        "model.norm.weight": torch.randn(64, generator=g).bfloat16(),
        "model.steps": torch.arange(7),
        "model.empty": torch.zeros(0),
    }


def _broadcast(transport, version: int, receivers: int):
    spec = transport.group(tuple(range(receivers)))
    handle = transport._handles[version]
    out = CTX.Queue()
    procs = [CTX.Process(target=_receive, args=(spec.url(), handle, out)) for _ in range(receivers)]
    for p in procs:
        p.start()
    try:
        assert transport.send(version, spec) == handle.nbytes
        got = [out.get(timeout=60) for _ in procs]
        got = [pickle.loads(x) if isinstance(x, bytes) else x for x in got]
    finally:
        for p in procs:
            p.join(30)
    return spec, got


def test_a_version_reaches_every_receiver_bit_exact_and_groups_renew():
    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    state = _state(0)
    handle = transport.push(state, 1)
    state["model.embed.weight"].add_(1.0)  # the caller may change its tensors after push
    spec, got = _broadcast(transport, 1, receivers=2)
    want = _state(0)
    for received in got:
        assert not isinstance(received, str), received
        assert list(received) == list(want)
        for name in want:
            assert received[name].dtype == want[name].dtype and torch.equal(
                received[name], want[name]
            )
    assert handle.nbytes == sum(t.numel() * t.element_size() for t in want.values())
    # another push: only the newest is held; a new number of receivers is a new group
    transport.push(_state(1), 2)
    assert transport.versions() == [2]
    spec2, got2 = _broadcast(transport, 2, receivers=1)
    assert spec2.id != spec.id and spec2.world == 2
    assert torch.equal(got2[0]["model.embed.weight"], _state(1)["model.embed.weight"])
    assert transport.group((0,)).id == spec2.id  # the same receivers: the same group
    restarted = transport.group((5,))
    assert restarted.id != spec2.id  # one restarted: a new group
    renewed = transport.group((5,), renew=True)  # a failed send: a new group, same members
    assert renewed.id != restarted.id and transport.group((5,)).id == renewed.id


def test_errors_name_what_to_do():
    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    handle = transport.push(_state(0), 3)
    with pytest.raises(RuntimeError, match="only through the run's weight sync"):
        pull_handle(handle)  # no group named: not pullable on its own
    with pytest.raises(RuntimeError, match="use type shm to pull versions by number"):
        transport.pull(3)
    with pytest.raises(KeyError, match="not held here"):
        transport.send(2, transport.group((0,)))
    with pytest.raises(ValueError, match="is not a weight group"):
        GroupSpec.parse("gloo://nowhere")
    with pytest.raises(ValueError, match="auto, gloo or nccl"):
        WeightTransportConfig(type="broadcast", backend="mpi")
    with pytest.raises(ValueError, match="applies to type 'broadcast' only"):
        WeightTransportConfig(type="shm", backend="gloo")
    with pytest.raises(ValueError, match="type broadcast has none"):
        WeightTransportConfig(type="broadcast", wait_s=5)
    if not torch.cuda.is_available():
        from forge.weights.group import join

        spec = GroupSpec("x" * 32, "127.0.0.1", transport.group((0,)).port, 2, "nccl")
        with pytest.raises(RuntimeError, match="needs CUDA"):
            join(spec, 0)


def test_a_member_that_dies_lets_the_others_go_at_once_not_at_the_timeout():
    """A receiver killed inside a formed group: the sender's broadcast fails and aborts the
    group, so the other receiver stops waiting within seconds (gloo alone: 60 s)."""
    import os
    import signal
    import time

    from forge.weights.group import BUCKET_TIMEOUT_S, GroupAborted, join

    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    transport.push(_state(0), 1)
    spec, handle = transport.group((0, 1)), transport._handles[1]
    out = CTX.Queue()
    procs = [CTX.Process(target=_receive, args=(spec.url(), handle, out)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        join(spec, 0)  # all three are in the group now; the receivers wait for the bytes
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].join(10)
        t0 = time.monotonic()
        with pytest.raises((RuntimeError, GroupAborted)):
            for _ in range(20):  # gloo may need a few buckets' worth to notice the dead pair
                transport.send(1, spec)
        got = out.get(timeout=BUCKET_TIMEOUT_S / 3)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    print(f"the survivor let go after {took:.2f} s: {str(got)[:120]}")
    assert took < 10, took
    # it was told the group was given up, or it got the bytes before the sender noticed
    assert isinstance(got, bytes) or "GroupAborted" in got, got


def test_an_aborted_group_fails_its_join_and_a_member_that_never_comes_is_not_waited_for():
    import threading
    import time

    from forge.weights.group import GroupAborted, join

    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    spec = transport.group((7, 8))  # two receivers that never arrive
    threading.Timer(0.5, transport.abort, args=(spec.id,)).start()
    t0 = time.monotonic()
    with pytest.raises(GroupAborted, match="aborted"):
        join(spec, 0)
    assert time.monotonic() - t0 < 5


def test_a_member_that_arrives_but_never_connects_is_not_waited_for_in_the_rendezvous():
    """All members arrived, one never enters gloo's rendezvous (it died there): the others,
    inside the rendezvous, let go when the group is aborted, not at gloo's 60 s timeout."""
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from forge.weights.group import JOIN_TIMEOUT_S, GroupAborted, join, key_prefix

    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    spec = transport.group((7,))  # one receiver: played here, it arrives and goes no further
    store = dist.TCPStore(spec.host, spec.port, None, False, timedelta(seconds=JOIN_TIMEOUT_S))
    prefixed = dist.PrefixStore(key_prefix(spec.id), store)
    assert prefixed.add("receivers", 1) == 1
    prefixed.add("arrived", 1)
    threading.Timer(1.0, transport.abort, args=(spec.id,)).start()
    t0 = time.monotonic()
    with pytest.raises(GroupAborted, match="rendezvous"):
        join(spec, 0)  # arrival passes; gloo's rendezvous waits for rank 1's address
    assert 0.9 < time.monotonic() - t0 < 5
