"""The broadcast weight group's rendezvous store, seen from another process on the host: it
listens on the loopback only (torch's own ``TCPStore`` listens on every interface whatever
address it is given), and listing its keys after a real broadcast shows no group id."""

from __future__ import annotations

import multiprocessing as mp
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from forge.weights import WeightTransportConfig, build_transport
from forge.weights.group import GroupHost, key_prefix
from tests.integration.components.test_weight_broadcast import _broadcast

CTX = mp.get_context("spawn")


def _listening(port: int) -> list[tuple[str, str]]:
    """(family, local address) of every listening TCP socket on ``port`` (/proc/net/tcp*)."""
    out = []
    for family in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{family}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                out.append((family, addr))
    return out


def test_store_listens_on_the_loopback_only():
    host = GroupHost("gloo")
    assert host.host == "127.0.0.1"  # one host: no TCP address of our own
    assert _listening(host.store.port) == [("tcp", "0100007F")]  # 127.0.0.1, nothing else
    # Reachable where it listens ...
    client = dist.TCPStore("127.0.0.1", host.store.port, None, False, timedelta(seconds=5))
    client.set("probe", "1")
    assert host.store.get("probe") == b"1"
    # ... and not on another address of this host, where there is one.
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    for ip in others - {"127.0.0.1", "127.0.1.1"}:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((ip, host.store.port)) != 0, ip


def test_listing_the_store_shows_no_group_id():
    transport = build_transport(WeightTransportConfig(type="broadcast", backend="gloo"))
    transport.push({"w": torch.arange(10.0)}, 1)
    spec, got = _broadcast(transport, 1, receivers=1)
    assert torch.equal(got[0]["w"], torch.arange(10.0))
    store = dist.TCPStore(spec.host, spec.port, None, False, timedelta(seconds=5))
    keys = store.list_keys()
    assert keys, "the group left no keys: the check below would prove nothing"
    assert not [k for k in keys if spec.id in k], keys
    assert key_prefix(spec.id) != key_prefix(spec.id + "0")
    assert spec.id not in key_prefix(spec.id)
