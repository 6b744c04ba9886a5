"""Server-sent events exactly as OpenAI sends them: ``event: <type>\\ndata: <json>\\n\\n``
for the Responses API, ``data: <json>`` lines ending with ``data: [DONE]`` for Completions.

``EventStreamResponse`` and ``DataStreamResponse`` are small ASGI responses rather than
Starlette's ``StreamingResponse`` because they must always run their ``on_close`` (which
cancels a non-background generation) when the client goes away: they watch ``receive()`` for
``http.disconnect`` and stop at once, even while waiting for the next token, instead of
noticing only at the next send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

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


class SSEResponse:
    """Send ``frames`` (SSE bytes) and then ``trailer``; a failure after the 200 becomes the
    frame ``error_frame`` makes of it; on the end, an error or a disconnect, ``on_close()``."""

    trailer = b""

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        error_frame: Callable[[BaseException], bytes],
    ) -> None:
        self._frames = frames
        self._on_close = on_close
        self._error_frame = error_frame

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
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            try:
                async for frame in self._frames:
                    await send(_body(frame))
            except (asyncio.CancelledError, OSError):
                raise
            except Exception as exc:  # the stream broke after the 200: say so in-band
                await send(_body(self._error_frame(exc)))
            if self.trailer:
                await send(_body(self.trailer))
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


class EventStreamResponse(SSEResponse):
    """Send Responses ``events`` as SSE; an error after the 200 is an ``error`` event."""

    def __init__(
        self,
        events: AsyncIterator[ResponseStreamEvent],
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        self._last = -1
        super().__init__(self._encoded(events), on_close, self._error)

    async def _encoded(self, events: AsyncIterator[ResponseStreamEvent]) -> AsyncIterator[bytes]:
        async for event in events:
            self._last = event.sequence_number
            yield encode(event)

    def _error(self, exc: BaseException) -> bytes:
        return encode_error(exc, self._last + 1)


class DataStreamResponse(SSEResponse):
    """Chat/legacy Completions streaming as OpenAI sends it: ``data: <json>`` frames without
    event names, ``data: [DONE]`` at the end, and an error as ``data: {"error": {...}}``."""

    trailer = b"data: [DONE]\n\n"

    def __init__(
        self, chunks: AsyncIterator[BaseModel], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(self._encoded(chunks), on_close, _data_error)

    @staticmethod
    async def _encoded(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            # unset fields left out: a later tool-call delta has no id, type or name (OpenAI's)
            data = chunk.model_dump_json(warnings=False, by_alias=True, exclude_unset=True)
            yield b"data: " + data.encode() + b"\n\n"


def _data_error(exc: BaseException) -> bytes:
    _, err = describe(exc)
    return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"
