"""The Responses API over HTTP on uvicorn: ``make_server(client)``, loopback by default.

It serves any ``AsyncResponsesClient`` (tests use a scripted one); the ``nbresponses serve``
command (``cli.py``) loads a model first. On Ctrl-C / SIGTERM the server stops taking requests
(503), lets the responses in flight finish for ``grace`` seconds, cancels what remains
(streaming clients read the open items closed and a clean end of stream), then closes
connections.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import uvicorn

from nbresponses.server.app import create_app
from nbresponses.server.routes import DEFAULT_MAX_BODY_BYTES, ResponsesAPI
from nbresponses.service.client import AsyncResponsesClient


class Server(uvicorn.Server):
    """uvicorn, draining our in-flight responses before it closes connections."""

    def __init__(self, config: uvicorn.Config, api: ResponsesAPI, grace: float) -> None:
        super().__init__(config)
        self.api = api
        self.grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.api.drain(self.grace)
        await super().shutdown(sockets)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(
    client: AsyncResponsesClient,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    grace: float = 10.0,
    log_level: str = "info",
    **uvicorn_options: Any,
) -> Server:
    """A uvicorn ``Server`` for ``client``; ``await server.serve()`` runs it on this loop."""
    app = create_app(client, api_key=api_key, max_body_bytes=max_body_bytes, shutdown_grace=grace)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        # uvicorn's annotation says int; it waits with asyncio, which takes seconds as float
        timeout_graceful_shutdown=grace,  # type: ignore[arg-type]
        **uvicorn_options,
    )
    return Server(config, app.state.api, grace)
