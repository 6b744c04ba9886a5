"""Server-sent events exactly as OpenAI sends them: ``event: <type>\\ndata: <json>\\n\\n``.

``EventStreamResponse`` is a small ASGI response rather than Starlette's ``StreamingResponse``
because it must always run its ``on_close`` (which cancels a non-background generation) when
the client goes away: it watches ``receive()`` for ``http.disconnect`` and stops at once, even
while it is waiting for the next token, instead of noticing only at the next send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from openai.types.responses import ResponseStreamEvent

from nbresponses.server.errors import describe

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def encode(event: ResponseStreamEvent) -> bytes:
    """One SSE frame: the event type as the SSE event name, the event as compact JSON."""
    data = event.model_dump_json(warnings=False, by_alias=True)
    return b"event: " + event.type.encode() + b"\ndata: " + data.encode() + b"\n\n"


def encode_error(error: BaseException, sequence_number: int) -> bytes:
    """An ``error`` event, for a failure after the stream began (the status is already 200)."""
    _, err = describe(error)
    data = {
        "type": "error",
        "code": err["code"],
        "message": err["message"],
        "param": err["param"],
        "sequence_number": sequence_number,
    }
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


def _body(data: bytes, *, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStreamResponse:
    """Send ``events`` as SSE; on the end, an error or a disconnect, await ``on_close()``."""

    def __init__(
        self,
        events: AsyncIterator[ResponseStreamEvent],
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def client_left(watch: asyncio.Future[None]) -> None:
            nonlocal gone
            if not watch.cancelled() and watch.exception() is None:
                gone = True
                task.cancel()

        watcher = asyncio.ensure_future(_disconnected(receive))
        watcher.add_done_callback(client_left)
        last = -1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            try:
                async for event in self._events:
                    last = event.sequence_number
                    await send(_body(encode(event)))
            except (asyncio.CancelledError, OSError):
                raise
            except Exception as exc:  # the stream broke after the 200: say so in-band
                await send(_body(encode_error(exc, last + 1)))
            watcher.remove_done_callback(client_left)
            await send(_body(b"", more=False))
        except asyncio.CancelledError:
            if not gone:
                raise  # shutdown or the caller's own cancellation: let it propagate
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
        except OSError:  # ASGI 2.4 servers raise on send once the client is gone
            gone = True
        finally:
            watcher.remove_done_callback(client_left)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._on_close())
