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

from forge.serve.config import ServeConfig

logger = logging.getLogger("forge.serve")

SDK_VERSIONS = ">=0.38,<0.39"  # the tinker SDK versions this server was tested against


def api_key_from(arg: str | None) -> str:
    from controller import env

    key = arg or env.api_key()
    if not key:
        raise ValueError(
            "forge serve needs an API key: pass --api-key tml-<secret> or set FORGE_API_KEY"
        )
    if not key.startswith("tml-"):
        raise ValueError(
            "the API key must start with 'tml-' (the tinker SDK sends no other keys); "
            f"got one starting with {key[:4]!r}"
        )
    return key


async def serve(cfg: ServeConfig, host: str, port: int, api_key: str, ready=None) -> None:
    """Serve until cancelled or interrupted; ``ready(url)`` is called once listening."""
    import uvicorn

    from forge.serve.app import build_app
    from forge.serve.state import ServerState

    state = ServerState(cfg)
    app = build_app(state, api_key)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
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


def main(config: str | None, host: str, port: int, api_key: str | None) -> int:
    """``forge serve``'s body; returns the exit code."""
    from controller import loops, shutdown
    from forge.serve.config import load_config

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
