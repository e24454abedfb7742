"""``forge serve``: the Tinker API over HTTP, backed by Forge's Trainer and Generator actors.

    forge serve [--config serve.yaml] [--host 127.0.0.1] [--port 8000] [--api-key tml-...]

The key may also come from ``FORGE_API_KEY``; it must start with ``tml-`` (the ``tinker`` SDK
refuses to send other keys). Clients then run unchanged::

    service = tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-...")
    training = service.create_lora_training_client(base_model="forge/tiny", rank=8)

See docs/tinker.md for what is served and what differs from the hosted service."""

from __future__ import annotations

import asyncio
import logging

from forge.serve.serve_config import ServeConfig

logger = logging.getLogger("forge.serve")

SDK_VERSIONS = ">=0.38,<0.39"  # the tinker SDK versions this server was tested against


MIN_SECRET_CHARS = 24  # after "tml-"; secrets.token_urlsafe(24) gives 32
MIN_DISTINCT_CHARS = 10
MAKE_KEY = "tml-$(python -c 'import secrets; print(secrets.token_urlsafe(24))')"


def api_key_from(arg: str | None) -> str:
    """The server's API key (``--api-key`` or ``FORGE_API_KEY``), refused when weak: it
    guards training and sampling on this host from anyone who can reach the port."""
    from controller import env_vars

    key = arg or env_vars.api_key()
    if not key:
        raise ValueError(
            "forge serve needs an API key: pass --api-key tml-<secret> or set FORGE_API_KEY, "
            f"e.g. FORGE_API_KEY={MAKE_KEY}"
        )
    if not key.startswith("tml-"):
        raise ValueError(
            "the API key must start with 'tml-' (the tinker SDK sends no other keys); "
            f"got one starting with {key[:4]!r}"
        )
    secret = key[len("tml-") :]
    if len(secret) < MIN_SECRET_CHARS or len(set(secret)) < MIN_DISTINCT_CHARS:
        raise ValueError(
            f"the API key is weak: its secret (after 'tml-') has {len(secret)} characters, "
            f"{len(set(secret))} distinct; use at least {MIN_SECRET_CHARS} random characters "
            f"with {MIN_DISTINCT_CHARS} distinct, e.g. --api-key {MAKE_KEY}"
        )
    return key


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) is reachable from this host only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(cfg: ServeConfig, host: str, port: int, api_key: str, ready=None) -> None:
    """Serve until cancelled or interrupted; ``ready(url)`` is called once listening."""
    import uvicorn

    from forge.serve.app import build_app
    from forge.serve.state import ServerState

    if not is_loopback(host):
        logger.warning(
            "listening on %s, not a loopback address: anyone who can reach port %s can try "
            "the API key, and requests (the key included) travel unencrypted; put a TLS "
            "proxy in front, or bind 127.0.0.1 and tunnel (docs/security.md)", host, port,
        )  # fmt: skip
    state = ServerState(cfg)
    app = build_app(state, api_key)
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level="warning", http=_protocol(cfg.header_timeout_s),
        limit_concurrency=cfg.max_connections,
    ))  # fmt: skip
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            if task.done():
                await task  # raises the bind error, if any
                raise RuntimeError(f"forge serve: the HTTP server on {host}:{port} did not start")
            await asyncio.sleep(0.05)
        url = f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
        names = ", ".join(m.name for m in cfg.models)
        print(f"[serve] Tinker API on {url} (tinker SDK {SDK_VERSIONS}); base models: {names}",
              flush=True)  # fmt: skip
        if ready is not None:
            ready(url)
        await task
    finally:
        server.should_exit = True
        app.state.futures.cancel_all()
        await state.close()


def _protocol(header_timeout_s: float):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a whole request
    head within ``header_timeout_s`` of connecting (uvicorn alone keeps a silent or
    byte-by-byte peer open for ever, holding a file descriptor and a connection slot)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_deadline = self.loop.call_later(header_timeout_s, self._drop_if_no_head)

        def _drop_if_no_head(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._head_deadline.cancel()
            super().connection_lost(exc)

    return Protocol


def main(config: str | None, host: str, port: int, api_key: str | None) -> int:
    """``forge serve``'s body; returns the exit code."""
    from controller import loops, shutdown
    from forge.serve.serve_config import load_config

    key = api_key_from(api_key)
    cfg = load_config(config)
    logging.basicConfig(level=logging.INFO, format="[serve] %(message)s")

    async def go() -> None:
        try:
            await serve(cfg, host, port, key)
        finally:
            await shutdown()

    try:
        loops.run(go())
    except KeyboardInterrupt:
        pass
    return 0
