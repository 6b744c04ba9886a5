"""The Responses API routes over one ``AsyncResponsesClient``: ``ResponsesAPI(client).routes``.

Each route parses HTTP (JSON body, query string) into the client's keyword arguments and turns
the result back into HTTP: a ``Response`` as JSON, a ``ResponseEventStream`` as SSE, an openai
``APIStatusError`` as OpenAI's error body with its status. The routes are plain Starlette
``Route``s, so they mount in any Starlette/FastAPI app (``Mount("/llm", routes=api.routes)``)
with the same key check and body limit as the stand-alone server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openai.types.responses import Response as ResponsesResponse
from pydantic import BaseModel
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, Router

from nbresponses.server.errors import HTTPError, from_exception
from nbresponses.server.loops import BLOCKED, foreign, iterate_on, on_loop
from nbresponses.server.sse import DataStreamResponse, EventStreamResponse
from nbresponses.server.tokenizer_info import tokenizer_info
from nbresponses.service.chat import ChatCompletionStream
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.completions import CompletionStream
from nbresponses.service.footprint import allocator_stats, mapped_files
from nbresponses.service.stream import ResponseEventStream

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
# SDK keywords that shape the HTTP call itself: never valid inside a JSON body.
TRANSPORT_KEYS = ("extra_headers", "extra_query", "extra_body", "timeout")
# An endpoint answers with a Starlette Response or an SSE stream (an ASGI app of its own).
Answer = Response | EventStreamResponse | DataStreamResponse
Handler = Callable[[Request], Awaitable[Answer]]


def json_model(model: BaseModel, status: int = 200) -> Response:
    return Response(
        model.model_dump_json(warnings=False, by_alias=True), status, media_type="application/json"
    )


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ResponsesAPI:
    """The HTTP face of a client: routes, key check, body limit, in-flight tracking."""

    def __init__(
        self,
        client: AsyncResponsesClient,
        *,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.client = client
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())
        self.closing = False
        self._streams: set[ResponseEventStream | CompletionStream | ChatCompletionStream] = set()
        self._work: set[asyncio.Task[Any]] = set()
        self._background: set[str] = set()

    # -- routing ----------------------------------------------------------------------------

    @property
    def routes(self) -> list[BaseRoute]:
        guard = self._guard
        return [
            Route("/health", guard(self.health, auth=False), methods=["GET"]),
            Route("/v1/models", guard(self.models), methods=["GET"]),
            Route("/v1/models/{model:path}", guard(self.model), methods=["GET"]),
            Route("/v1/responses", guard(self.create), methods=["POST"]),
            Route("/v1/completions", guard(self.complete), methods=["POST"]),
            Route("/v1/chat/completions", guard(self.chat), methods=["POST"]),
            Route("/tokenize", guard(self.tokenize), methods=["POST"]),
            Route("/detokenize", guard(self.detokenize), methods=["POST"]),
            Route("/tokenizer_info", guard(self.tokenizer_info), methods=["GET"]),
            Route("/v1/responses/{response_id}", guard(self.retrieve), methods=["GET"]),
            Route("/v1/responses/{response_id}", guard(self.delete), methods=["DELETE"]),
            Route("/v1/responses/{response_id}/cancel", guard(self.cancel), methods=["POST"]),
            Route(
                "/v1/responses/{response_id}/input_items",
                guard(self.input_items),
                methods=["GET"],
            ),
        ]

    def router(self) -> Router:
        """The routes as one ASGI app, for ``Mount("/prefix", app=api.router())``."""
        return Router(routes=self.routes)

    def _guard(self, handler: Handler, *, auth: bool = True) -> Handler:
        async def endpoint(request: Request) -> Answer:
            try:
                if self.closing:
                    raise HTTPError(503, "The server is shutting down.", type_="server_error")
                if auth:
                    self._authorize(request)
                return await handler(request)
            except Exception as exc:
                return from_exception(exc)

        endpoint.__name__ = handler.__name__
        return endpoint

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPError(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        if not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise HTTPError(401, "Incorrect API key provided.", code="invalid_api_key")

    # -- request parsing --------------------------------------------------------------------

    async def _json_body(self, request: Request) -> dict[str, Any]:
        too_big = HTTPError(
            413,
            f"The request body is larger than {self.max_body_bytes} bytes.",
            code="request_too_large",
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_big
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except RecursionError:
            raise HTTPError(
                400, "The JSON body of your request is nested too deeply to be parsed."
            ) from None
        except ValueError:
            raise HTTPError(
                400,
                "We could not parse the JSON body of your request. The API expects a JSON "
                "payload, but what was sent was not valid JSON.",
            ) from None
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object.")
        for key in TRANSPORT_KEYS:
            if key in body:
                raise HTTPError(
                    400, f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter"
                )
        return body

    @staticmethod
    def _query_bool(query: QueryParams, key: str) -> bool | None:
        value = query.get(key)
        if value is None:
            return None
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise HTTPError(400, f"Invalid '{key}': expected true or false.", param=key)

    @staticmethod
    def _query_int(query: QueryParams, key: str) -> int | None:
        value = query.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise HTTPError(400, f"Invalid '{key}': expected an integer.", param=key) from None

    @staticmethod
    def _query_list(query: QueryParams, key: str) -> list[str] | None:
        values = query.getlist(f"{key}[]") + query.getlist(key)
        return values or None

    def _owner(
        self, request: Request, response_id: str, *, read_only: bool = False
    ) -> asyncio.AbstractEventLoop | None:
        """The loop to carry a call about ``response_id`` to (None: call it here)."""
        blocked = request.scope.get("extensions", {}).get(BLOCKED)
        loop = self.client.responses.generating_on(response_id)  # None: finished or unknown
        return foreign(response_id, loop, blocked, read_only=read_only)

    # -- routes -----------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """Liveness for probes (no key needed); with the key (or none set), the client's
        figures too: load, KV and prefix-cache memory and hit rate, the store's fill, and what
        the C allocator holds (``allocator``: in use, freed but kept, mmapped), and the
        resident pages of mapped files (``mapped``: the model's weights file, libraries)."""
        body: dict[str, Any] = {"status": "ok", "model": self.client.model}
        try:
            self._authorize(request)
        except HTTPError:
            return JSONResponse(body)
        memory = {"allocator": allocator_stats(), "mapped": mapped_files()}
        return JSONResponse({**body, **self.client.stats(), **memory})

    def _model(self) -> dict[str, Any]:
        return {
            "id": self.client.model,
            "object": "model",
            "created": self.created,
            "owned_by": "nbresponses",
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.client.model:
            raise HTTPError(
                404,
                f"The model '{name}' does not exist.",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(self._model())

    async def create(self, request: Request) -> Answer:
        body = await self._json_body(request)
        if body.get("stream") is True:
            stream = await self.client.responses.create(**body)
            assert isinstance(stream, ResponseEventStream)
            if body.get("background") is True:
                self._track(stream.response_id)
            return self._sse(stream, None)
        work = asyncio.ensure_future(self.client.responses.create(**body))
        self._work.add(work)
        work.add_done_callback(self._work.discard)
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()  # the client left: stop generating (create keeps the partial)
        if work.cancelled():
            return Response(status_code=499)  # nobody is there to read it
        result = work.result()
        assert isinstance(result, ResponsesResponse)  # not streamed: the Response itself
        if result.background:
            self._track(result.id)
        return json_model(result)

    async def complete(self, request: Request) -> Answer:
        """``POST /v1/completions``: the legacy Completions API (``service/completions.py``)."""
        body = await self._json_body(request)
        completions = self.client.completions
        if body.get("stream") is True:
            stream = await completions.create(**body)
            assert isinstance(stream, CompletionStream)
            self._streams.add(stream)

            async def close() -> None:
                self._streams.discard(stream)
                await stream.close()

            return DataStreamResponse(stream, close)
        result = await self._until_done_or_gone(request, completions.create(**body))
        return result if isinstance(result, Response) else json_model(result)

    async def chat(self, request: Request) -> Answer:
        """``POST /v1/chat/completions``: Chat Completions (``service/chat.py``)."""
        body = await self._json_body(request)
        completions = self.client.chat.completions
        if body.get("stream") is True:
            stream = await completions.create(**body)
            assert isinstance(stream, ChatCompletionStream)
            self._streams.add(stream)

            async def close() -> None:
                self._streams.discard(stream)
                await stream.close()

            return DataStreamResponse(stream, close)
        result = await self._until_done_or_gone(request, completions.create(**body))
        return result if isinstance(result, Response) else json_model(result)

    async def _until_done_or_gone(self, request: Request, work: Awaitable[Any]) -> Any:
        """Await ``work``, cancelled if the client leaves first (then a 499 nobody reads)."""
        task = asyncio.ensure_future(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
        if task.cancelled():
            return Response(status_code=499)
        return task.result()

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize`` as vLLM serves it: the ids the engine reads for ``prompt`` (no
        special tokens are added: prompts are given to the engine as they are)."""
        body = await self._json_body(request)
        self._check_model(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise HTTPError(400, "'prompt' must be a string.", param="prompt")
        if body.get("add_special_tokens", False) is not False:
            raise HTTPError(
                400,
                "nbresponses adds no special tokens to a prompt: send "
                "add_special_tokens=false (or omit it).",
                param="add_special_tokens",
                code="unsupported_parameter",
            )
        ids = self.client.completions.tokenize(prompt)
        return JSONResponse(
            {"count": len(ids), "max_model_len": self.client.source.context_length, "tokens": ids}
        )

    async def detokenize(self, request: Request) -> Response:
        """``POST /detokenize`` as vLLM serves it: the text of token ids."""
        body = await self._json_body(request)
        self._check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
        ):
            raise HTTPError(400, "'tokens' must be a list of token ids.", param="tokens")
        vocab = self._vocab_size()
        if tokens and vocab is not None and max(tokens) >= vocab:  # as /v1/completions does
            raise HTTPError(
                400,
                f"Invalid 'tokens': token ids must be in the vocabulary [0, {vocab}); "
                f"got {min(tokens)}..{max(tokens)}.",
                param="tokens",
            )
        return JSONResponse({"prompt": self.client.family.decode(tokens)})

    async def tokenizer_info(self, request: Request) -> Response:
        """``GET /tokenizer_info`` as vLLM serves it (``server/tokenizer_info.py``)."""
        if self.client.tokenizer is None:
            raise HTTPError(404, "This server's model has no tokenizer to describe.")
        return JSONResponse(tokenizer_info(self.client.tokenizer, self.client.model))

    def _vocab_size(self) -> int | None:
        """The ids the engine reads: its logits' width, else the tokenizer's length."""
        size = getattr(getattr(self.client.source, "runner", None), "vocab_size", None)
        tokenizer = self.client.tokenizer
        if size is None and tokenizer is not None:
            size = len(tokenizer)  # type: ignore[arg-type]
        return None if size is None else int(size)

    def _check_model(self, body: dict[str, Any]) -> None:
        name = body.get("model")
        if name is not None and name != self.client.model:
            raise HTTPError(
                404, f"The model '{name}' does not exist.", param="model", code="model_not_found"
            )

    async def retrieve(self, request: Request) -> Answer:
        response_id = request.path_params["response_id"]
        query = request.query_params
        stream = self._query_bool(query, "stream")
        starting_after = self._query_int(query, "starting_after")
        include = self._query_list(query, "include")
        obfuscation = self._query_bool(query, "include_obfuscation")
        loop = self._owner(request, response_id, read_only=not stream)
        result = await on_loop(
            loop,
            lambda: self.client.responses.retrieve(
                response_id,
                stream=stream,
                starting_after=starting_after,
                include=include,
                include_obfuscation=obfuscation,
            ),
        )
        if isinstance(result, ResponseEventStream):
            return self._sse(result, loop)
        return json_model(result)

    async def cancel(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        loop = self._owner(request, response_id)
        return json_model(await on_loop(loop, lambda: self.client.responses.cancel(response_id)))

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        loop = self._owner(request, response_id)
        await on_loop(loop, lambda: self.client.responses.delete(response_id))
        self._background.discard(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        query = request.query_params
        page = await self.client.responses.input_items.list(
            response_id,
            after=query.get("after"),
            limit=self._query_int(query, "limit"),
            order=query.get("order"),
            include=self._query_list(query, "include"),
        )
        return json_model(page)

    def _sse(
        self, stream: ResponseEventStream, loop: asyncio.AbstractEventLoop | None
    ) -> EventStreamResponse:
        """Stream events as SSE; closing (end, error, disconnect) closes the event stream."""
        self._streams.add(stream)

        async def close() -> None:
            self._streams.discard(stream)
            await on_loop(loop, stream.close)

        events = stream if loop is None else iterate_on(loop, stream)
        return EventStreamResponse(events, close)

    # -- shutdown ---------------------------------------------------------------------------

    def _track(self, response_id: str) -> None:
        """Remember a background response until it ends (for ``drain``); forget finished ones."""
        for known in list(self._background):
            if not self.client.responses.running(known):
                self._background.discard(known)
        self._background.add(response_id)

    def _busy(self) -> bool:
        responses = self.client.responses
        return bool(
            self._streams or self._work or any(map(responses.running, list(self._background)))
        )

    async def drain(self, grace: float = 10.0, poll: float = 0.05) -> None:
        """Refuse new requests; let work in flight finish for ``grace`` seconds, then cancel it.

        Cancelled responses end as OpenAI's do (status ``cancelled``, partial output kept): a
        streaming client reads the open items' ``done`` events and a clean end of stream.
        """
        self.closing = True
        deadline = time.monotonic() + grace
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(poll)
        for work in list(self._work):
            work.cancel()
        for stream in list(self._streams):
            await stream.cancel()
        for response_id in list(self._background):
            if self.client.responses.running(response_id):
                await self.client.responses.cancel(response_id)
        while self._busy() and time.monotonic() < deadline + grace:
            await asyncio.sleep(poll)  # let the streams send their last events
