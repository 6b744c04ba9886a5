"""In-process HTTP for the openai SDK: its HTTP library's transports, calling an ASGI app.

httpx2's own ``ASGITransport`` waits for the whole response body before returning, so a
streamed ``create`` would arrive all at once at the end. These transports return as soon as the
app sends its response head and hand each body chunk (one SSE event) to the reader as the app
sends it. Closing the response early tells the app the client left (``http.disconnect``),
which stops a non-background generation, exactly as dropping a socket does.

``ASGIStreamTransport`` (for ``openai.AsyncOpenAI``) runs the app on the caller's loop;
``SyncASGIStreamTransport`` (for ``openai.OpenAI``) runs it on a ``LoopThread`` so a blocking
call from a notebook cell never waits on the loop it blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2

from nbresponses.server.loops import BLOCKED, LoopThread

ASGIApp = Callable[..., Any]
END = object()  # the body is complete
CLOSE_TIMEOUT = 5.0  # how long closing a response waits for the app to clean up


def _read_timeout(request: httpx2.Request) -> float | None:
    """The SDK's read timeout for this request: the longest wait for the head or a chunk."""
    timeout = request.extensions.get("timeout")
    return timeout.get("read") if isinstance(timeout, dict) else None


def _scope(request: httpx2.Request, extensions: dict[str, Any]) -> dict[str, Any]:
    url = request.url
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "root_path": "",
        "server": (url.host, url.port or 80),
        "client": ("127.0.0.1", 0),
        "extensions": extensions,
    }


class Exchange:
    """One request to the app: its task, the response head, and body chunks handed to ``sink``.

    ``sink`` receives each body chunk, then ``END`` or the exception that broke the body.
    """

    def __init__(
        self, app: ASGIApp, scope: dict[str, Any], body: bytes, sink: Callable[[Any], None]
    ) -> None:
        self._app = app
        self._scope = scope
        self._body: bytes | None = body
        self._sink = sink
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._over = asyncio.Event()  # the client left, or the response is complete
        self._complete = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        try:
            return await asyncio.shield(self._head)
        except asyncio.CancelledError:
            await self.close()  # the caller gave up before the response began
            raise

    async def close(self) -> None:
        """The client is done reading: tell the app, give it a moment to clean up."""
        self._over.set()
        if not self.task.done():
            _, pending = await asyncio.wait({self.task}, timeout=CLOSE_TIMEOUT)
            for task in pending:
                task.cancel()

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._over.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            if not self._head.done():
                self._head.set_result((message["status"], headers))
        elif kind == "http.response.body" and not self._complete:
            body = message.get("body", b"")
            if body:
                self._sink(bytes(body))
            if not message.get("more_body", False):
                self._complete = True
                self._sink(END)
                self._over.set()

    async def _run(self) -> None:
        try:
            await self._app(self._scope, self._receive, self._send)
        except BaseException as exc:
            if not self._head.done():
                self._head.set_exception(exc)
            elif not self._complete:
                self._complete = True
                self._sink(httpx2.ReadError(f"The app failed mid-response: {exc!r}"))
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            if not self._head.done():
                self._head.set_exception(RuntimeError("The ASGI app sent no response."))
            elif not self._complete:
                self._complete = True
                self._sink(END)


class _AsyncBody(httpx2.AsyncByteStream):
    def __init__(
        self, exchange: Exchange, chunks: asyncio.Queue[Any], request: httpx2.Request
    ) -> None:
        self._exchange = exchange
        self._chunks = chunks
        self._request = request

    async def _next(self) -> Any:
        if not self._chunks.empty():
            return self._chunks.get_nowait()
        timeout = _read_timeout(self._request)
        try:
            return await asyncio.wait_for(self._chunks.get(), timeout)
        except asyncio.TimeoutError:
            raise httpx2.ReadTimeout(
                "No data within the read timeout.", request=self._request
            ) from None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._next()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def aclose(self) -> None:
        await self._exchange.close()


class ASGIStreamTransport(httpx2.AsyncBaseTransport):
    """Send each request to ``app`` on the running loop; stream the body as it is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        chunks: asyncio.Queue[Any] = asyncio.Queue()
        exchange = Exchange(self.app, _scope(request, {}), body, chunks.put_nowait)
        try:
            status, headers = await asyncio.wait_for(exchange.head(), _read_timeout(request))
        except asyncio.TimeoutError:  # the app was told the client left (see Exchange.head)
            raise httpx2.ReadTimeout(
                "No response within the read timeout.", request=request
            ) from None
        stream = _AsyncBody(exchange, chunks, request)
        return httpx2.Response(status, headers=headers, stream=stream, request=request)


class _SyncBody(httpx2.SyncByteStream):
    def __init__(
        self,
        exchange: Exchange,
        chunks: queue.SimpleQueue[Any],
        loop: LoopThread,
        request: httpx2.Request,
    ) -> None:
        self._exchange = exchange
        self._chunks = chunks
        self._loop = loop
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        timeout = _read_timeout(self._request)
        while True:
            try:
                item = self._chunks.get(timeout=timeout)
            except queue.Empty:
                raise httpx2.ReadTimeout(
                    "No data within the read timeout.", request=self._request
                ) from None
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.submit(self._exchange.close()).result(CLOSE_TIMEOUT + 1)


class SyncASGIStreamTransport(httpx2.BaseTransport):
    """Send each request to ``app`` on a ``LoopThread``; block here for the head and chunks."""

    def __init__(self, app: ASGIApp, loop: LoopThread) -> None:
        self.app = app
        self.loop = loop

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        try:  # the loop this thread runs (a notebook's), which our call blocks
            blocked = asyncio.get_running_loop()
        except RuntimeError:
            blocked = None
        scope = _scope(request, {BLOCKED: blocked})
        chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def start() -> tuple[Exchange, int, list[tuple[bytes, bytes]]]:
            exchange = Exchange(self.app, scope, body, chunks.put)
            status, headers = await exchange.head()
            return exchange, status, headers

        future = self.loop.submit(start())
        try:
            exchange, status, headers = future.result(_read_timeout(request))
        except concurrent.futures.TimeoutError:
            future.cancel()  # the app is told the client left (see Exchange.head)
            raise httpx2.ReadTimeout(
                "No response within the read timeout.", request=request
            ) from None
        except BaseException:  # e.g. KeyboardInterrupt from a notebook's stop button
            future.cancel()
            raise
        stream = _SyncBody(exchange, chunks, self.loop, request)
        return httpx2.Response(status, headers=headers, stream=stream, request=request)
