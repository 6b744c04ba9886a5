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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        for sock in sockets or []:
            no_delay(sock)
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.api.drain(self.grace)
        await super().shutdown(sockets)


def no_delay(sock: socket.socket) -> None:
    """Send each write at once (TCP_NODELAY) on a listening socket we are given; the
    connections it accepts inherit it.

    Why: asyncio sets TCP_NODELAY only on sockets whose ``proto`` reads IPPROTO_TCP, which
    ``socket.socket()`` (proto 0) never does, and uvicorn writes a response's head and body
    apart: with Nagle's algorithm the body waited for the client's delayed ACK, 40 ms on
    Linux, so every request to a server started on such a socket took 40+ ms longer
    (``GET /v1/models`` 44 ms against 1.3 ms; benchmarks/README.md, apis.py). A host/port
    bound by uvicorn itself was never affected.
    """
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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
