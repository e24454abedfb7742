"""Hostile peers at Forge's listeners: a peer that connects and says nothing (slow loris),
many of them at once, a truncated handshake, garbage instead of a proof. Each case runs a real
actor process and real sockets (a Unix socket; TCP on the loopback only) and asserts that the
actor keeps serving, the attacker is dropped within the bound, and no process is left behind.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from controller import _wire
from controller._runtime import get_runtime
from tests.helpers import pid_alive
from tests.integration.controller.actors import Counter

HELLO = len(_wire._MAGIC) + _wire._NONCE  # what a listener says first


@pytest.fixture
async def counter(monkeypatch):
    """A Counter whose process drops silent peers after 1 s and holds at most 4 of them."""
    monkeypatch.setenv("FORGE_HANDSHAKE_TIMEOUT_S", "1")
    monkeypatch.setenv("FORGE_MAX_PENDING_CONNECTIONS", "4")
    c = await Counter.as_actor()
    pid = c.pids[0]
    yield c
    await c.shutdown()
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not pid_alive(pid), "the actor process outlived its shutdown"


def _connect(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(address[len("unix:") :])
    return s


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed ``s`` (reading and discarding what it sends), or
    ``None`` if it was still open after ``seconds``."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # not readable (a non-dumpable process of ours, as a user other than root)
        return None


async def test_silent_peer_is_dropped_after_the_handshake_timeout(counter):
    address = counter._infos[0].address
    s = await asyncio.to_thread(_connect, address)
    took = await asyncio.to_thread(_closed_within, s, 6.0)
    s.close()
    assert took is not None, "a peer that sent nothing was still connected after 6 s"
    assert took < 4.0
    assert await counter.incr.call_one(1, timeout=10) == 1  # it kept serving


async def test_truncated_handshake_and_garbage_proofs_are_dropped(counter):
    address = counter._infos[0].address

    def attack() -> list[float | None]:
        out = []
        for payload in (b"\x00" * 10, os.urandom(63), b"FRG1" * 100):
            s = _connect(address)
            s.sendall(payload)  # part of a proof (then nothing), or a wrong one
            out.append(_closed_within(s, 6.0))
            s.close()
        return out

    times = await asyncio.to_thread(attack)
    assert all(t is not None and t < 4.0 for t in times), times
    assert await counter.value.call_one(timeout=10) == 0


async def test_pending_connections_are_capped_and_the_actor_keeps_serving(counter):
    address = counter._infos[0].address
    pid = counter.pids[0]
    assert await counter.incr.call_one(5, timeout=10) == 5  # an authenticated channel, open
    before = _open_fds(pid)

    def flood() -> tuple[list[socket.socket], list[socket.socket]]:
        held = [_connect(address) for _ in range(4)]
        for s in held:  # each was greeted: it counts against the cap
            assert len(s.recv(HELLO, socket.MSG_WAITALL)) == HELLO
        extra = [_connect(address) for _ in range(20)]
        return held, extra

    held, extra = await asyncio.to_thread(flood)
    try:
        # Over the cap: closed at once, before any greeting.
        refused = await asyncio.to_thread(lambda: [_closed_within(s, 2.0) for s in extra])
        assert all(t is not None for t in refused), refused
        # Meanwhile the open channel still works ...
        assert await counter.incr.call_one(1, timeout=10) == 6
        fds = _open_fds(pid)
        if before is not None:
            assert fds <= before + 4 + 2  # the 4 held peers, not the 20 refused ones
        # ... and once the silent peers are dropped, a new authenticated peer gets in.
        dropped = await asyncio.to_thread(lambda: [_closed_within(s, 6.0) for s in held])
        assert all(t is not None for t in dropped), dropped
    finally:
        for s in held + extra:
            s.close()
    key = get_runtime().session.authkey
    proto = await _wire.open_channel(address, key, lambda *a: None, None)
    proto.transport.close()
    if before is not None:
        await asyncio.sleep(0.2)
        assert _open_fds(pid) <= before + 2  # no descriptor left behind by the attack


async def test_a_busy_actor_does_not_drop_a_peer_that_answered_in_time(counter):
    """The actor's loop is blocked (3 s, over the 1 s bound) right after it greeted a peer;
    the peer sends its proof at once. It must be let in: the bound is on the peer, not on
    the actor's own loop (uvloop runs overdue timers before it reads the socket)."""
    address = counter._infos[0].address
    key = get_runtime().session.authkey
    greeted = threading.Event()

    def peer() -> bytes:
        s = _connect(address)
        try:
            hello = s.recv(HELLO, socket.MSG_WAITALL)
            greeted.set()
            time.sleep(0.3)  # the actor is blocked by now
            nonce = os.urandom(32)
            s.sendall(_wire._proof(key, hello[4:], b"c") + nonce)
            s.settimeout(15)
            proof = s.recv(32, socket.MSG_WAITALL)
            return proof == _wire._proof(key, nonce, b"s")
        finally:
            s.close()

    accepted = asyncio.ensure_future(asyncio.to_thread(peer))
    await asyncio.to_thread(greeted.wait, 10)
    await counter.apply.call_one(time.sleep, 3.0, timeout=30)  # blocks the actor's loop
    assert await accepted, "a peer that answered in time was dropped by a busy actor"


async def test_tcp_listener_drops_silent_peers_on_the_loopback():
    key = os.urandom(32)
    server = await _wire.serve("tcp:127.0.0.1:0", key, lambda *a: None, None, 0.5, 2)
    port = server.sockets[0].getsockname()[1]

    def attack() -> list[float | None]:
        peers = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        try:
            return [_closed_within(s, 4.0) for s in peers]
        finally:
            for s in peers:
                s.close()

    try:
        times = await asyncio.to_thread(attack)
        assert all(t is not None for t in times), times
        # The listener still accepts a peer that holds the key.
        proto = await _wire.open_channel(f"tcp:127.0.0.1:{port}", key, lambda *a: None, None)
        proto.transport.close()
    finally:
        server.close()


def test_handshake_bounds_are_checked(monkeypatch):
    from controller import env_vars

    monkeypatch.setenv("FORGE_HANDSHAKE_TIMEOUT_S", "0")
    with pytest.raises(ValueError, match="FORGE_HANDSHAKE_TIMEOUT_S must be a positive"):
        env_vars.handshake_timeout_s()
    monkeypatch.setenv("FORGE_MAX_PENDING_CONNECTIONS", "lots")
    with pytest.raises(ValueError, match="FORGE_MAX_PENDING_CONNECTIONS must be a positive"):
        env_vars.max_pending_connections()
    monkeypatch.delenv("FORGE_HANDSHAKE_TIMEOUT_S")
    monkeypatch.delenv("FORGE_MAX_PENDING_CONNECTIONS")
    assert env_vars.handshake_timeout_s() == 10.0 and env_vars.max_pending_connections() == 64
