"""Peers authenticate before a byte is unpickled; sockets live in a private directory."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import stat
import struct

import pytest

from controller import _wire
from controller._runtime import get_runtime
from tests.integration.controller.actors import Counter


class _Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


async def test_session_dir_is_private():
    await Counter.as_actor()
    mode = stat.S_IMODE(os.stat(get_runtime().session.dir).st_mode)
    assert mode == 0o700


async def test_unauthenticated_client_is_rejected_before_unpickling(tmp_path):
    c = await Counter.as_actor()
    marker = tmp_path / "pwned"
    address = c._infos[0].address[len("unix:") :]
    payload = pickle.dumps(_Boom(str(marker)))
    frame = struct.pack("<QBQ", len(payload), _wire.CALL, 1) + payload
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
    s.settimeout(5)
    hello = s.recv(36)
    assert hello[:4] == b"FRG1"
    s.sendall(b"\0" * 64 + frame)  # a wrong proof, then a malicious frame
    assert s.recv(100) == b""  # the server hangs up
    s.close()
    await asyncio.sleep(0.2)
    assert not marker.exists()
    assert await c.value.call_one() == 0  # and keeps serving


async def test_wrong_key_client_fails_authentication():
    c = await Counter.as_actor()
    with pytest.raises(ConnectionError, match="authentication"):
        await _wire.open_channel(c._infos[0].address, os.urandom(32), lambda *a: None, None)


async def test_tcp_channel_authenticates():
    key = os.urandom(32)
    got = []

    def on_frame(proto, kind, cid, body):
        got.append(bytes(body))
        proto.send(_wire.OK, cid, b"pong")

    server = await _wire.serve("tcp:127.0.0.1:0", key, on_frame, None)
    port = server.sockets[0].getsockname()[1]
    replies = []
    proto = await _wire.open_channel(
        f"tcp:127.0.0.1:{port}", key, lambda p, k, c, b: replies.append(bytes(b)), None
    )
    proto.send(_wire.CALL, 1, b"ping")
    for _ in range(100):
        if replies:
            break
        await asyncio.sleep(0.01)
    assert got == [b"ping"] and replies == [b"pong"]
    with pytest.raises(ConnectionError):
        await _wire.open_channel(f"tcp:127.0.0.1:{port}", b"x" * 32, lambda *a: None, None)
    server.close()
