"""Fuzzing Forge's wire decoder (``controller._wire``) with hypothesis, for a bounded number
of examples: valid frames cut at any points decode to exactly themselves; arbitrary bytes,
before or after authentication, never raise out of the decoder, never dispatch a frame
unauthenticated, and an absurd length closes the channel; and a real actor process fed
malformed and truncated frames by an authenticated peer keeps answering within its bound."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller import _wire, shutdown
from controller._runtime import get_runtime
from tests.helpers import pid_alive
from tests.integration.controller.actors import Counter

KEY = os.urandom(32)
HEADER = struct.Struct("<QBQ")
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


class _Transport:
    """An in-memory stand-in for an asyncio transport: records writes and aborts."""

    def __init__(self):
        self.out = bytearray()
        self.aborted = False

    def write(self, data):
        self.out += data

    def writelines(self, chunks):
        for c in chunks:
            self.out += c

    def abort(self):
        self.aborted = True

    close = abort

    def get_extra_info(self, name):
        return None


@pytest.fixture(autouse=True)
def _stop_everything():
    """Overrides tests/conftest.py's per-test shutdown: the ``actor`` below lives for the whole
    module (and ``_loop`` sets the module's event loop)."""
    yield


@pytest.fixture(autouse=True, scope="module")
def _loop():
    loop = asyncio.new_event_loop()  # FrameProtocol makes its `ready` future on it
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


def _server(authenticate: bool = True):
    got: list[tuple[int, int, bytes]] = []
    t = _Transport()
    proto = _wire.FrameProtocol(KEY, True, lambda p, k, c, b: got.append((k, c, bytes(b))))
    proto.connection_made(t)
    if authenticate:
        client_nonce = os.urandom(32)
        proto.data_received(_wire._proof(KEY, bytes(t.out[4:36]), b"c") + client_nonce)
        assert proto._state == "open" and not t.aborted
    return proto, t, got


def _feed(proto, data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in zip(points, points[1:]):
        proto.data_received(data[a:b])


frames = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 2**64 - 1), st.binary(max_size=200)),
    max_size=8,
)


@FAST
@given(frames, st.lists(st.integers(0, 10_000), max_size=12), st.sampled_from([16, 1 << 20]))
def test_valid_frames_cut_anywhere_decode_to_themselves(fs, cuts, large):
    old, _wire.LARGE_FRAME = _wire.LARGE_FRAME, large  # 16: the in-place assembly path too
    try:
        proto, t, got = _server()
        _feed(proto, b"".join(HEADER.pack(len(b), k, c) + b for k, c, b in fs), cuts)
    finally:
        _wire.LARGE_FRAME = old
    assert got == fs and not t.aborted


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 10_000), max_size=12))
def test_arbitrary_bytes_after_authentication_never_raise(data, cuts):
    proto, t, got = _server()
    _feed(proto, data, cuts)  # raises nothing: frames, or waiting for more, or closed
    consumed = sum(HEADER.size + len(b) for _, _, b in got)
    assert consumed <= len(data)


@FAST
@given(st.binary(max_size=400), st.lists(st.integers(0, 10_000), max_size=12))
def test_arbitrary_bytes_before_authentication_dispatch_nothing(data, cuts):
    proto, t, got = _server(authenticate=False)
    _feed(proto, data, cuts)
    assert got == [] and proto._state != "open"
    if len(data) >= 64:
        assert t.aborted  # a wrong proof: closed


@FAST
@given(st.integers(_wire.MAX_FRAME + 1, 2**64 - 1), st.binary(max_size=64))
def test_an_absurd_length_closes_the_channel(n, tail):
    proto, t, got = _server()
    proto.data_received(HEADER.pack(n, _wire.CALL, 1) + tail)
    assert t.aborted and got == []


# -- a real actor process --------------------------------------------------------------------
def _authenticated(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(address[len("unix:") :])
    hello = s.recv(36, socket.MSG_WAITALL)
    assert hello[:4] == _wire._MAGIC
    nonce = os.urandom(32)
    key = get_runtime().session.authkey
    s.sendall(_wire._proof(key, hello[4:], b"c") + nonce)
    assert s.recv(32, socket.MSG_WAITALL) == _wire._proof(key, nonce, b"s")
    return s


def _ping(address: str) -> int:
    """The worker's pid, from a PING on a fresh channel (within the socket's 10 s)."""
    s = _authenticated(address)
    try:
        s.sendall(HEADER.pack(0, _wire.PING, 7))
        n, kind, cid = HEADER.unpack(s.recv(HEADER.size, socket.MSG_WAITALL))
        body = s.recv(n, socket.MSG_WAITALL)
        assert (kind, cid) == (_wire.OK, 7)
        return pickle.loads(body)
    finally:
        s.close()


# Every kind but EXIT (a peer with the key may legitimately stop the process).
KINDS = [
    0,
    _wire.CALL,
    _wire.SPAWN,
    _wire.STOP_ACTOR,
    _wire.CANCEL,
    _wire.PING,
    _wire.READ,
    _wire.OK,
    _wire.ERR,
    99,
    255,
]
bad_frames = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2**64 - 1), st.binary(max_size=64)),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def actor():
    c = Counter.as_actor().get()
    yield c
    shutdown().get()
    assert not pid_alive(c.pids[0])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(bad_frames, st.binary(max_size=30), st.booleans())
def test_a_worker_survives_malformed_and_truncated_frames(actor, fs, tail, big):
    address = actor._infos[0].address
    pid = actor.pids[0]
    s = _authenticated(address)
    try:
        data = b"".join(HEADER.pack(len(b), k, c) + b for k, c, b in fs)
        if big:  # a length the peer never completes (the in-place assembly path)
            tail = HEADER.pack(_wire.LARGE_FRAME * 4, _wire.CALL, 1) + tail
        s.sendall(data + tail)  # then hang up mid-frame
    finally:
        s.close()
    assert _ping(address) == pid  # still answering, on a new channel
    assert actor.value.call_one(timeout=10).get() == 0  # and its state is intact
