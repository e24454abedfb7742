"""Authenticated, framed message channels over Unix-domain (or TCP) sockets.

Every connection starts with a mutual HMAC-SHA256 challenge-response on the session's shared
secret; until both sides have proven they hold it, no byte is unpickled. After that a frame is

    [u64 body length][u8 kind][u64 call id][body]

where ``body`` is a pickle (see ``_serialization``). Keeping the kind and call id outside
the pickle lets one pickled request be sent to many ranks, and lets a reply be routed
without unpickling it first.

A listener drops a peer that has not completed the handshake within
``FORGE_HANDSHAKE_TIMEOUT_S`` (default 10 s), and holds at most
``FORGE_MAX_PENDING_CONNECTIONS`` (default 64) unauthenticated peers at once, closing newer
ones at once: a peer that connects and sends nothing cannot starve it of descriptors.
Frames after the handshake carry no MAC (see docs/security.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("controller")

_HEADER = struct.Struct("<QBQ")
_MAGIC = b"FRG1"
_NONCE = 32
LARGE_FRAME = 1 << 20  # bodies this big are assembled in place and sent without a join
# A length field above this is a broken or hostile peer, not a message: the channel is closed
# (no attempt to allocate it). Far above any real message (weights move in 32 MiB chunks).
MAX_FRAME = 1 << 40

LATE_S = 0.5  # a handshake timer that fires this late was held up by our own busy loop

# Frame kinds.
CALL, SPAWN, STOP_ACTOR, CANCEL, EXIT, PING, READ = 1, 2, 3, 4, 5, 6, 7
OK, ERR = 16, 17


def _proof(key: bytes, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


class FrameProtocol(asyncio.Protocol):
    """Both ends of a channel: handshake first, then frames handed to ``on_frame``."""

    def __init__(
        self,
        authkey: bytes,
        server: bool,
        on_frame: Callable[[FrameProtocol, int, int, memoryview], None],
        on_lost: Callable[[FrameProtocol, Exception | None], None] | None = None,
        gate: _Gate | None = None,
    ):
        self._key = authkey
        self._gate = gate  # a server's count of peers not yet authenticated
        self._gated = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # loop time the handshake is due by
        self._server = server
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buf = bytearray()
        self._state = "init"
        self._nonce = os.urandom(_NONCE)
        self.transport: Any = None  # the asyncio transport, once connection_made ran
        self._large: Any = None  # (kind, cid, body, bytes got) of a large frame, or None
        self.ready: asyncio.Future = asyncio.get_event_loop().create_future()
        self.closed = False

    # -- handshake -------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _keepalive(transport.get_extra_info("socket"))
        if self._server:
            gate = self._gate
            if gate is not None:
                if gate.pending >= gate.cap:
                    gate.refused += 1
                    if gate.refused & (gate.refused - 1) == 0:  # 1, 2, 4, ...: not a flood of logs
                        logger.warning(
                            "refused a connection: %d peers are already authenticating (the "
                            "cap, FORGE_MAX_PENDING_CONNECTIONS); %d refused so far",
                            gate.pending,
                            gate.refused,
                        )
                    self._state = "rejected"
                    self._fail_ready(ConnectionError("refused: too many pending connections"))
                    transport.abort()
                    return
                gate.pending += 1
                self._gated = True
                loop = asyncio.get_event_loop()
                self._deadline = loop.time() + gate.timeout_s
                self._timer = loop.call_later(gate.timeout_s, self._expire, gate.timeout_s)
            transport.write(_MAGIC + self._nonce)
            self._state = "await_client_proof"
        else:
            self._state = "await_server_nonce"

    def _handshake(self) -> bool:
        buf = self._buf
        if self._state == "await_server_nonce":
            if len(buf) < len(_MAGIC) + _NONCE:
                return False
            if bytes(buf[:4]) != _MAGIC:
                return self._reject("peer is not a Forge actor endpoint (bad magic)")
            server_nonce = bytes(buf[4 : 4 + _NONCE])
            del buf[: 4 + _NONCE]
            self.transport.write(_proof(self._key, server_nonce, b"c") + self._nonce)
            self._state = "await_server_proof"
            return True
        if self._state == "await_server_proof":
            if len(buf) < 32:
                return False
            if not hmac.compare_digest(bytes(buf[:32]), _proof(self._key, self._nonce, b"s")):
                return self._reject("server failed authentication")
            del buf[:32]
            return self._open()
        if self._state == "await_client_proof":
            if len(buf) < 32 + _NONCE:
                return False
            if not hmac.compare_digest(bytes(buf[:32]), _proof(self._key, self._nonce, b"c")):
                return self._reject("client failed authentication")
            client_nonce = bytes(buf[32 : 32 + _NONCE])
            del buf[: 32 + _NONCE]
            self.transport.write(_proof(self._key, client_nonce, b"s"))
            return self._open()
        return False

    def _expire(self, after_s: float) -> None:
        if self._state in ("open", "rejected"):
            return
        loop = asyncio.get_event_loop()
        if loop.time() - self._deadline > LATE_S:
            # This process's loop was busy (an actor's __init__, a blocking call), not the
            # peer slow: its proof may be waiting unread (uvloop runs due timers before it
            # polls sockets). Look again once the loop has read what arrived.
            self._deadline = loop.time() + LATE_S
            self._timer = loop.call_later(LATE_S, self._expire, after_s)
            return
        self._reject(f"no handshake within {after_s:g} s")

    def _ungate(self) -> None:
        """This peer no longer counts against the listener's cap of pending handshakes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._gated:
            self._gated = False
            self._gate.pending -= 1  # pyright: ignore[reportOptionalMemberAccess]  # gated: a gate

    def _open(self) -> bool:
        self._state = "open"
        self._ungate()
        if not self.ready.done():
            self.ready.set_result(None)
        return True

    def _reject(self, why: str) -> bool:
        logger.warning("rejected connection: %s", why)
        self._ungate()
        self._fail_ready(ConnectionError(f"authentication failed: {why}"))
        self._state = "rejected"
        self.transport.abort()
        return False

    def _fail_ready(self, err: Exception) -> None:
        if not self.ready.done():
            self.ready.set_exception(err)
            if self._server:
                self.ready.exception()  # nobody awaits a server's handshake; mark it seen

    # -- frames ----------------------------------------------------------------------------
    def data_received(self, data: bytes):
        if self._state == "open" and not self._buf and self._large is None:
            # Fast path: the chunk is exactly one frame.
            if len(data) >= _HEADER.size:
                n, kind, cid = _HEADER.unpack_from(data)
                if len(data) == _HEADER.size + n:
                    self._on_frame(self, kind, cid, memoryview(data)[_HEADER.size :])
                    return
        if self._large is not None:
            data = self._fill_large(data)
            if not data:
                return
        self._buf += data
        while self._state != "open":
            if self._state == "rejected" or not self._handshake():
                return
        buf = self._buf
        while len(buf) >= _HEADER.size:
            n, kind, cid = _HEADER.unpack_from(buf)
            if n > MAX_FRAME:
                self._state = "rejected"
                logger.warning("closed a channel: a frame of %d bytes is over the limit", n)
                self.transport.abort()
                buf.clear()
                return
            end = _HEADER.size + n
            if len(buf) < end:
                if n >= LARGE_FRAME:  # assemble it in place: one copy, not three
                    body = bytearray(n)
                    got = len(buf) - _HEADER.size
                    body[:got] = memoryview(buf)[_HEADER.size :]
                    buf.clear()
                    self._large = (kind, cid, body, got)
                return
            body = bytes(buf[_HEADER.size : end])
            del buf[:end]
            self._on_frame(self, kind, cid, memoryview(body))

    def _fill_large(self, data: bytes) -> bytes:
        """Copy ``data`` into the large frame being assembled; dispatch it when complete.
        Returns what follows the frame (the start of the next one)."""
        kind, cid, body, got = self._large
        take = min(len(data), len(body) - got)
        body[got : got + take] = memoryview(data)[:take]
        got += take
        if got < len(body):
            self._large = (kind, cid, body, got)
            return b""
        self._large = None
        self._on_frame(self, kind, cid, memoryview(body))
        return data[take:]

    def send(self, kind: int, cid: int, body: bytes = b"") -> None:
        if self.closed:
            raise ConnectionError("channel is closed")
        header = _HEADER.pack(len(body), kind, cid)
        if len(body) >= LARGE_FRAME:
            self.transport.writelines((header, body))  # no copy into one buffer first
        else:
            self.transport.write(header + body)

    def connection_lost(self, exc):
        self.closed = True
        self._ungate()
        self._fail_ready(
            ConnectionError(
                "connection closed during authentication: the peer rejected our credentials "
                f"(different session?) or exited ({exc})"
            )
        )
        if self._on_lost is not None:
            self._on_lost(self, exc)


# A TCP peer whose host vanished (power, link) never closes its socket: probe an idle
# connection after 5 s, every 2 s, and drop it after 3 unanswered probes (~11 s); data sent
# but unacknowledged for 15 s drops it too. Unix sockets need none of this.
KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 15_000}


def _keepalive(sock) -> None:
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in KEEPALIVE.items():
            if hasattr(socket, name):  # Linux names; other systems keep their defaults
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError as e:  # not fatal: the backend's failure detector still applies
        logger.debug("TCP keepalive not set: %s", e)


def parse_address(address: str) -> tuple[str, Any]:
    """``unix:/path`` or ``tcp:host:port`` -> (family, target): a path, or ``(host, port)``."""
    family, _, rest = address.partition(":")
    if family == "unix":
        return family, rest
    if family == "tcp":
        host, _, port = rest.rpartition(":")
        return family, (host, int(port))
    raise ValueError(f"unknown address {address!r}; expected unix:/path or tcp:host:port")


async def open_channel(
    address: str,
    authkey: bytes,
    on_frame: Callable,
    on_lost: Callable | None,
    timeout: float = 10.0,
) -> FrameProtocol:
    """Connect and authenticate; raises ``ConnectionError`` on failure."""
    loop = asyncio.get_running_loop()
    family, target = parse_address(address)

    def factory():
        return FrameProtocol(authkey, False, on_frame, on_lost)

    if family == "unix":
        _, proto = await asyncio.wait_for(loop.create_unix_connection(factory, target), timeout)
    else:
        _, proto = await asyncio.wait_for(loop.create_connection(factory, *target), timeout)
    await asyncio.wait_for(proto.ready, timeout)
    return proto


class _Gate:
    """A listener's bound on peers that have not authenticated yet: how many at once
    (``cap``) and for how long each (``timeout_s``)."""

    def __init__(self, timeout_s: float, cap: int):
        self.timeout_s, self.cap = timeout_s, cap
        self.pending = 0  # peers connected and not yet authenticated
        self.refused = 0  # peers closed at once because ``pending`` was at the cap


async def serve(
    address: str,
    authkey: bytes,
    on_frame: Callable,
    on_lost: Callable | None,
    handshake_timeout_s: float | None = None,
    max_pending: int | None = None,
):
    """Listen on ``address``; each accepted peer must authenticate before any frame is read,
    within ``handshake_timeout_s`` (default ``FORGE_HANDSHAKE_TIMEOUT_S``), and at most
    ``max_pending`` peers (default ``FORGE_MAX_PENDING_CONNECTIONS``) may be authenticating at
    once."""
    from controller import env_vars

    loop = asyncio.get_running_loop()
    family, target = parse_address(address)
    gate = _Gate(
        env_vars.handshake_timeout_s() if handshake_timeout_s is None else handshake_timeout_s,
        env_vars.max_pending_connections() if max_pending is None else max_pending,
    )

    def factory():
        return FrameProtocol(authkey, True, on_frame, on_lost, gate)

    if family == "unix":
        server = await loop.create_unix_server(factory, target)
    else:
        server = await loop.create_server(factory, *target)
    return server
