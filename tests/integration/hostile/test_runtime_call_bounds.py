"""A lost controller host: the home (``controller._home``) accepts the session's peers and
then never answers. Every call to it ends within ``FORGE_CALL_TIMEOUT_S`` with an error that
names the call, instead of waiting for ever."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller import _wire, files
from controller._home import home, recall
from controller._runtime import get_runtime
from controller.errors import CallTimeoutError


@pytest.fixture
async def silent_home(monkeypatch):
    """A listener with the session's key that authenticates peers and answers nothing (a
    controller host that stopped), handed to this process as its home."""
    server = await _wire.serve(
        "tcp:127.0.0.1:0", get_runtime().session.authkey, lambda *a: None, None
    )
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("FORGE_HOME", f"tcp:127.0.0.1:{port}")
    monkeypatch.setenv("FORGE_CALL_TIMEOUT_S", "1")
    yield
    server.close()


async def test_home_calls_are_bounded_by_default(silent_home):
    h = home()
    start = time.monotonic()
    with pytest.raises(CallTimeoutError, match=r"Home\.tree on rank 0 .* within 1\.0 s"):
        await asyncio.wait_for(h.tree.call_one("/nowhere"), 20)
    assert time.monotonic() - start < 5
    with pytest.raises(CallTimeoutError, match=r"Home\.replace"):  # publishing a staged file
        await asyncio.wait_for(h.replace.call_one("/a", "/b"), 20)


async def test_staging_a_file_through_a_lost_home_fails_in_time(silent_home):
    assert files.remote()
    with pytest.raises(CallTimeoutError, match=r"Home\.tree"):
        await asyncio.wait_for(files.stage("/not/here/model.safetensors"), 20)


async def test_an_explicit_timeout_still_wins(silent_home, monkeypatch):
    monkeypatch.setenv("FORGE_CALL_TIMEOUT_S", "0")  # no default bound ...
    assert home()._default_timeout is None
    with pytest.raises(CallTimeoutError, match=r"Home\.get .* within 10\.0 s"):
        await asyncio.wait_for(recall("k"), 30)  # ... recall passes its own 10 s
