"""``create_app(client)``: the Responses API as a stand-alone Starlette app.

Unknown paths and wrong methods answer in OpenAI's error shape too, and the app's lifespan
drains in-flight work on shutdown (for any ASGI server; ``serve`` also drains before uvicorn
starts closing connections, so streaming clients get their last events).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from nbresponses.server.errors import error_response
from nbresponses.server.routes import DEFAULT_MAX_BODY_BYTES, ResponsesAPI
from nbresponses.service.client import AsyncResponsesClient


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {
        404: f"Invalid URL ({request.method} {request.url.path})",
        405: f"Method {request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    body = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return error_response(exc.status_code, body)


def create_app(
    client: AsyncResponsesClient,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    shutdown_grace: float = 10.0,
) -> Starlette:
    """A Starlette app serving ``client`` at ``/v1/responses`` (and ``/v1/models``, ``/health``).

    ``app.state.api`` is the ``ResponsesAPI`` behind it (its ``drain()`` ends in-flight work).
    """
    api = ResponsesAPI(client, api_key=api_key, max_body_bytes=max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await api.drain(0 if api.closing else shutdown_grace)

    app = Starlette(
        routes=api.routes,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.api = api
    return app
