"""``forge serve`` bounds open connections, not only requests: however many idle
connections a client opens (silent, a partial request head, idle after a keep-alive
response), at most ``serve.max_connections`` stay open and a real request is still answered;
connections holding a request in flight are never closed to make room. The server runs in
this process on 127.0.0.1 (a thread), with no actors."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

from forge.serve.serve_config import ServeConfig, toy_models  # noqa: E402
from forge.serve.server import serve  # noqa: E402

KEY = "tml-connections-key-0123456789abcdefgh"
H = {"X-API-Key": KEY}
MAX = 8


@contextlib.contextmanager
def _server(tmp_path):
    cfg = ServeConfig(
        models=toy_models(), dir=str(tmp_path), max_connections=MAX, header_timeout_s=60.0
    )
    loop, box, started = asyncio.new_event_loop(), {}, threading.Event()

    def ready(url: str) -> None:
        box["url"] = url
        started.set()

    def run() -> None:
        box["task"] = loop.create_task(serve(cfg, "127.0.0.1", 0, KEY, ready))
        with contextlib.suppress(BaseException):
            loop.run_until_complete(box["task"])
        rest = asyncio.all_tasks(loop)  # what is left, cancelled as asyncio.run does
        for task in rest:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60), "the server did not start"
    try:
        yield box["url"]
    finally:
        loop.call_soon_threadsafe(box["task"].cancel)
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


def _open(url: str, n: int, first: bytes = b"") -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    out = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        if first:
            s.sendall(first)
        out.append(s)
    return out


def _still_open(socks: list[socket.socket], wait_s: float = 0.5) -> list[socket.socket]:
    """The sockets the server has not closed (after ``wait_s`` for closes to arrive)."""
    time.sleep(wait_s)
    return [s for s in socks if not _closed(s)]


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (what it sent before is read and dropped)."""
    s.setblocking(False)
    try:
        # bounded: a closed socket reads b"" after what it had
        return any(not s.recv(1 << 16) for _ in range(64))
    except BlockingIOError:
        return False  # nothing more to read, and not closed
    except OSError:
        return True  # reset
    finally:
        s.setblocking(True)


def _keep_alive_idle(url: str, n: int) -> list[socket.socket]:
    """Connections that had a request answered and stay open, idle (HTTP/1.1 keep-alive)."""
    head = b"GET /api/v1/healthz HTTP/1.1\r\nHost: x\r\nX-API-Key: " + KEY.encode() + b"\r\n\r\n"
    socks = _open(url, n, head)
    for s in socks:
        assert s.recv(4096).startswith(b"HTTP/1.1 200"), "the keep-alive request failed"
    return socks


@pytest.mark.parametrize("extra", [1, MAX, 5 * MAX])
def test_idle_connections_past_the_cap_never_lock_out_a_request(tmp_path, extra):
    with _server(tmp_path) as url:
        partial = b"GET /api/v1/healthz HTTP/1.1\r\nHo"
        idle = _keep_alive_idle(url, 2)
        idle += _open(url, (MAX + extra) // 2) + _open(
            url, MAX + extra - (MAX + extra) // 2, partial
        )
        n = len(_still_open(idle))
        assert n <= MAX, f"{n} connections open, over serve.max_connections={MAX}"
        for _ in range(3):  # each time a new connection, answered
            t0 = time.monotonic()
            r = httpx.get(f"{url}/api/v1/healthz", headers=H, timeout=5)
            assert r.status_code == 200 and time.monotonic() - t0 < 5, r.text
        for s in idle:
            s.close()


def test_connections_with_a_request_in_flight_are_not_closed_for_new_ones(tmp_path):
    with _server(tmp_path) as url:
        # A request head promising a body that has not come: the request is in flight.
        head = (
            b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: "
            + KEY.encode()
            + b"\r\nContent-Length: 2\r\n\r\n"
        )
        busy = _open(url, MAX, head)
        time.sleep(0.3)
        late = _open(url, 3)
        assert _still_open(late) == [], "a connection past the cap was kept"
        assert len(_still_open(busy)) == MAX, "a connection with a request in flight was closed"
        for s in busy:
            s.sendall(b"{}")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            s.close()
        assert httpx.get(f"{url}/api/v1/healthz", headers=H, timeout=5).status_code == 200


def test_the_open_file_limit_is_raised_to_fit_or_the_server_refuses_to_start(monkeypatch):
    import resource

    from forge.serve.server import FD_HEADROOM, ensure_fd_room

    limits, calls = {"now": (1024, 4096)}, []
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, lim: calls.append(lim))
    ensure_fd_room(256)  # fits already
    assert calls == []
    ensure_fd_room(1500)  # 1,500 connections: raised up to the hard limit
    assert calls == [(1500 + FD_HEADROOM, 4096)]
    with pytest.raises(ValueError, match=r"lower serve.max_connections to 3840 or raise"):
        ensure_fd_room(4000)
