"""The in-kernel Responses API: ``AsyncResponsesClient(source, tokenizer, model=...).responses``.

``responses`` mirrors ``openai.AsyncOpenAI().responses``: ``create``, ``retrieve``, ``cancel``,
``delete``, ``input_items.list``, plus ``run`` (a tool loop over Python callables). A streamed
create returns a ``ResponseEventStream``; a non-streamed one is the same run with its events
folded. Each request runs in its own task, so one failing request never touches another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import openai
from openai.types.responses import Response, ResponseItemList
from openai.types.responses.response_text_config import ResponseTextConfig
from openai.types.shared.response_format_text import ResponseFormatText

from nbresponses.families.base import Family, ReaderWrap, RenderedPrompt
from nbresponses.families.registry import FamilyName, select_family
from nbresponses.protocol.errors import bad_request, response_not_found, unsupported
from nbresponses.protocol.generation import Sampling
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.items import check_call_outputs
from nbresponses.protocol.request import CreateRequest, given, parse_create, sampling_of
from nbresponses.service.chat import AsyncChat
from nbresponses.service.completions import AsyncCompletions
from nbresponses.service.database import RUNNING, StorePath, open_database
from nbresponses.service.function_tools import run_tools
from nbresponses.service.record import Record
from nbresponses.service.run import Generation, ResponseRun
from nbresponses.service.store import STORE_DEFAULTS, ResponseStore
from nbresponses.service.stream import ResponseEventStream
from nbresponses.tokens.contract import SamplingParams, Tokenizer, TokenSource


class AsyncResponsesClient:
    """A local stand-in for ``openai.AsyncOpenAI``: the Responses API, and the legacy
    Completions API (``completions.create``) that scoring tools read prompt logprobs from.

    ``family`` says how the model reads and writes tokens: "auto" (gpt-oss when ``config`` has
    ``model_type == "gpt_oss"`` or the tokenizer knows harmony's tokens, else the tokenizer's
    chat template), "chat", "harmony", or a ``Family`` object. Options of one family are given
    by constructing it: gpt-oss's built-in tools (a python sandbox, a browser backend, their
    limits) with ``HarmonyFamily(browser=..., python_timeout=..., max_tool_calls=...)``.
    """

    def __init__(
        self,
        source: TokenSource,
        tokenizer: Tokenizer | None,
        *,
        model: str,
        family: FamilyName | Family = "auto",
        config: Any = None,
        store_max_responses: int = STORE_DEFAULTS.max_responses,
        store_max_bytes: int = STORE_DEFAULTS.max_bytes,
        store_path: StorePath = STORE_DEFAULTS.client_path,
        store_keep_days: float | None = STORE_DEFAULTS.keep_days,
        store_max_disk_bytes: int | None = STORE_DEFAULTS.max_disk_bytes,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        """``store_path``: where stored responses are kept (see ``open_database``): a SQLite
        file (None: the default file in the user's data dir), "memory" (this process only,
        the default here; ``StoreDefaults`` says why) or "off" (nothing kept).
        ``store_max_responses`` / ``store_max_bytes`` bound what is held in memory;
        ``store_keep_days`` / ``store_max_disk_bytes`` what the file keeps. ``provenance``
        (model name, recipe, hash) is stored with each response.
        """
        self.source = source
        self.tokenizer = tokenizer
        self.model = model
        self.family = select_family(family, source=source, tokenizer=tokenizer, config=config)
        self.keeps = store_path != "off"
        database = open_database(
            store_path, keep_days=store_keep_days, max_disk_bytes=store_max_disk_bytes
        )
        self.store = ResponseStore(store_max_responses, store_max_bytes, database)
        self.provenance = dict(provenance or {})
        self.responses = AsyncResponses(self)
        # The legacy Completions API on the same engine (prompt logprobs for scoring tools).
        self.completions = AsyncCompletions(source, self.family, model=model)
        # Chat Completions: an adapter over ``responses`` (service/chat.py).
        self.chat = AsyncChat(self.responses, self.completions)

    def stats(self) -> dict[str, Any]:
        """The store's fill and the token source's figures (the engine: rows, KV, prefix cache)."""
        store = self.store
        return {
            "store": {
                "responses": len(store),
                "bytes": store.bytes,
                "max_responses": store.max_responses,
                "max_bytes": store.max_bytes,
                "database": store.database.stats() if store.database is not None else None,
            },
            "source": dict(self.source.stats()),
        }

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every stored response is written to the database (True when written)."""
        return self.store.database.flush(timeout) if self.store.database is not None else True

    def close(self) -> None:
        """Write what is queued and close the database (the memory store stays readable)."""
        if self.store.database is not None:
            self.store.database.close()

    async def aclose(self, timeout: float = 10.0) -> None:
        """Cancel the stored responses still running (kept as cancelled), then ``close``."""
        runs = [record.run for record in self.store.running()]
        for run in runs:
            run.cancel()
        if runs:
            await asyncio.wait([asyncio.ensure_future(run.wait()) for run in runs], timeout=timeout)
        await asyncio.to_thread(self.close)


class AsyncInputItems:
    """``client.responses.input_items``."""

    def __init__(self, client: AsyncResponsesClient) -> None:
        self._client = client

    async def list(
        self,
        response_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str | None = None,
        include: Sequence[str] | None = None,
        **transport: Any,
    ) -> ResponseItemList:
        """The request's own input items (newest first by default, as OpenAI pages them)."""
        record = self._client.store.get(response_id)
        if record is None:
            raise response_not_found(response_id)
        if given(include) and include:
            raise unsupported("include")
        items = list(record.input)
        if (order or "desc") == "desc":
            items.reverse()
        elif order != "asc":
            raise bad_request("'order' must be 'asc' or 'desc'.", param="order")
        if given(after):
            ids = [i.id for i in items]
            if after not in ids:
                raise bad_request(f"No item with id '{after}'.", param="after")
            items = items[ids.index(after) + 1 :]
        size = limit if limit is not None and given(limit) else 20
        if not 1 <= size <= 100:
            raise bad_request("'limit' must be between 1 and 100.", param="limit")
        page: list[Any] = items[:size]  # input items are the SDK's item types
        return ResponseItemList(
            object="list",
            data=page,
            first_id=page[0].id if page else "",
            last_id=page[-1].id if page else "",
            has_more=len(items) > size,
        )


class AsyncResponses:
    """``client.responses``: the methods of ``openai.AsyncOpenAI().responses`` we serve."""

    def __init__(self, client: AsyncResponsesClient) -> None:
        self._client = client
        self.input_items = AsyncInputItems(client)

    # -- create ---------------------------------------------------------------------------

    async def create(self, **kwargs: Any) -> Response | ResponseEventStream:
        """Create a response: a ``Response``, or a ``ResponseEventStream`` when ``stream=True``."""
        req = parse_create(kwargs, model=self._client.model)
        run = self._start(req)
        if req.stream:
            return ResponseEventStream(run, owns_run=not req.background)
        if req.background:
            return run.response.model_copy(deep=True)
        try:
            response = await asyncio.shield(run.wait())
        except asyncio.CancelledError:
            run.cancel()  # the caller gave up: stop generating, keep what was made
            raise
        return response.model_copy(deep=True)

    @property
    def source(self) -> TokenSource:
        """The token source the runs generate on."""
        return self._client.source

    def start(
        self,
        req: CreateRequest,
        *,
        sampling: Sampling | None = None,
        reader: ReaderWrap | None = None,
    ) -> ResponseRun:
        """Start a validated request's run, as ``create`` does (the Chat Completions adapter
        runs each choice so): ``sampling`` is the request core's sampling when the API has
        more of it than Responses (top_k, logit_bias); ``reader`` makes the output reader
        from the rendered prompt, wrapping the family's (to count the tokens as they come)."""
        return self._start(req, sampling, reader)

    def _start(
        self,
        req: CreateRequest,
        sampling: Sampling | None = None,
        reader: ReaderWrap | None = None,
    ) -> ResponseRun:
        """Validate, render, run, store: from here on the run alone writes the response."""
        client = self._client
        if req.background and not client.keeps:
            raise bad_request(
                "Background responses need a store, and this engine keeps none (store_path='off').",
                param="background",
            )
        context = self._context(req)
        prompt = self._render(req, context)
        params = self._params(req, prompt, sampling)
        output_reader = prompt.output_reader if reader is None else reader(prompt)
        generation = Generation(client.source, prompt.ids, params, output_reader)
        stored = req.store and client.keeps
        run = ResponseRun(
            self._response(req),
            generation,
            on_done=client.store.finished if stored else None,  # stored before it is seen done
        )
        if stored:
            client.store.put(self._new_record(req, run, context))
        run.start()
        return run

    def _context(self, req: CreateRequest) -> list[Any]:
        """The conversation before this request: the parent's, through the parent's output."""
        if req.previous_response_id is None:
            return []
        parent = self._client.store.parent(req.previous_response_id)
        if parent is None:
            raise bad_request(
                f"Previous response with id '{req.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if not parent.run.done.is_set() or parent.run.response.status in RUNNING:
            raise bad_request(
                f"Previous response '{req.previous_response_id}' is still running.",
                param="previous_response_id",
            )
        if parent.partial:
            raise bad_request(
                f"The conversation before '{req.previous_response_id}' is no longer "
                "stored, so it cannot be continued.",
                param="previous_response_id",
            )
        return parent.conversation()

    def _render(self, req: CreateRequest, context: list[Any]) -> RenderedPrompt:
        """The family's prompt for the conversation so far and this request's input."""
        client = self._client
        check_call_outputs(context, req.input)
        conversation = [*context, *req.input]
        if not conversation:
            raise bad_request(
                "'input' is empty: give a message (or items) for the model to answer.",
                param="input",
            )
        client.family.check(req, conversation)
        prompt = client.family.render(req, conversation)
        if len(prompt.ids) >= client.source.context_length:
            raise bad_request(
                f"The prompt has {len(prompt.ids)} tokens; this model's context holds "
                f"{client.source.context_length}.",
                param="input",
                code="context_length_exceeded",
            )
        return prompt

    def _params(
        self, req: CreateRequest, prompt: RenderedPrompt, sampling: Sampling | None = None
    ) -> SamplingParams:
        """The sampling the request asked for, with the family's stops and constraint."""
        return (sampling or sampling_of(req)).engine_params(
            max_tokens=req.max_output_tokens or self._client.source.context_length,
            stop_token_ids=prompt.stop_token_ids,
            logprobs=req.logprobs,
            top_logprobs=req.top_logprobs,
            processed_logprobs=req.logprobs_mode == "processed_logprobs",
            constraint=prompt.constraint,
        )

    def _new_record(self, req: CreateRequest, run: ResponseRun, context: list[Any]) -> Record:
        """What the store keeps of a request: its run, its input and the conversation before."""
        return Record(
            run=run,
            input=req.input,
            context=context,
            background=req.background,
            request=_stored_request(req),
            provenance=self._client.provenance,
        )

    def _response(self, req: CreateRequest) -> Response:
        # vLLM's extensions the request set, kept on the Response as extra fields (the SDK's
        # type keeps them; retrieve and the frames read them): ``seed``, ``logprobs_mode``
        extensions: dict[str, Any] = {}
        if req.seed is not None:
            extensions["seed"] = req.seed
        if req.logprobs_mode != "raw_logprobs":
            extensions["logprobs_mode"] = req.logprobs_mode
        return Response(
            id=new_id("resp"),
            object="response",
            created_at=time.time(),
            model=self._client.model,
            status="in_progress",
            output=[],
            background=req.background,
            instructions=req.instructions,
            metadata=req.metadata,
            max_output_tokens=req.max_output_tokens,
            parallel_tool_calls=req.parallel_tool_calls,
            previous_response_id=req.previous_response_id,
            temperature=req.temperature,
            top_p=req.top_p,
            top_logprobs=req.top_logprobs,
            tool_choice=req.tool_choice,
            tools=req.all_tools,
            reasoning=req.reasoning,
            text=_text_config(req),
            truncation="disabled",
            **cast(dict[str, Any], req.echoed),  # labels the SDK echoes (user, ...)
            **extensions,
        )

    # -- what a server needs to know -----------------------------------------------------

    def running(self, response_id: str) -> bool:
        """True while a stored response is still being generated."""
        record = self._client.store.get(response_id)
        return record is not None and not record.run.done.is_set()

    def generating_on(self, response_id: str) -> asyncio.AbstractEventLoop | None:
        """The event loop generating a stored response (None once it finished, or unknown):
        calls that touch it from another thread are carried there."""
        record = self._client.store.get(response_id)
        if record is None or record.run.done.is_set() or record.run.task is None:
            return None
        return record.run.task.get_loop()

    # -- retrieve, cancel, delete ---------------------------------------------------------

    def _stored(self, response_id: str) -> Record:
        record = self._client.store.get(response_id)
        if record is None:
            raise response_not_found(response_id)
        return record

    async def retrieve(
        self,
        response_id: str,
        *,
        stream: bool | None = None,
        starting_after: int | None = None,
        include: Sequence[str] | None = None,
        include_obfuscation: bool | None = None,
        **transport: Any,
    ) -> Response | ResponseEventStream:
        """The stored response; with ``stream=True`` (background only) its events after N."""
        record = self._stored(response_id)
        if given(include) and include:
            raise unsupported("include", "logprobs are kept when the create asked for them.")
        if not stream:
            if given(starting_after):
                raise bad_request("'starting_after' needs stream=True.", param="starting_after")
            return record.run.response.model_copy(deep=True)
        if not record.background:
            raise bad_request("Only background responses can be streamed again.", param="stream")
        after = starting_after if starting_after is not None and given(starting_after) else -1
        if after < -1:
            raise bad_request("'starting_after' must be -1 or more.", param="starting_after")
        last = len(record.run.events) - 1
        if after > last and record.run.done.is_set():  # (a running one may still get there)
            raise bad_request(
                f"'starting_after' is {after}, past the last event of this response "
                f"(sequence number {last}).",
                param="starting_after",
            )
        return ResponseEventStream(record.run, after=after)

    async def cancel(self, response_id: str, **transport: Any) -> Response:
        """Cancel a background response: status ``cancelled``, partial output kept; idempotent."""
        record = self._stored(response_id)
        if not record.background:
            raise bad_request("Cannot cancel a synchronous response.", param="response_id")
        record.run.cancel()
        await record.run.wait()
        return record.run.response.model_copy(deep=True)

    async def delete(self, response_id: str, **transport: Any) -> None:
        """Forget a stored response (a running one is cancelled first)."""
        record = self._stored(response_id)
        record.run.cancel()
        await record.run.wait()
        self._client.store.remove(response_id)

    async def parse(self, *, text_format: Any = None, **kwargs: Any) -> Any:
        """``create`` whose answer is parsed, as the openai SDK's ``responses.parse``:
        ``text_format`` (a pydantic model) becomes a strict ``json_schema`` format, and the
        result is a ``ParsedResponse`` with ``output_parsed`` (and parsed tool arguments)."""
        from openai.lib._parsing._responses import parse_response, type_to_text_format_param

        if kwargs.get("stream"):
            raise bad_request(
                "parse() returns the whole response; stream with engine.openai()"
                ".responses.stream(text_format=...).",
                param="stream",
            )
        if text_format is not None:
            text = dict(kwargs.get("text") or {})
            if "format" in text:
                raise TypeError("Cannot mix and match text.format with text_format")
            text["format"] = type_to_text_format_param(text_format)
            kwargs["text"] = text
        response = await self.create(**kwargs)
        assert isinstance(response, Response)
        return parse_response(
            text_format=text_format if text_format is not None else openai.omit,
            input_tools=kwargs.get("tools"),
            response=response,
        )

    # -- the tool loop --------------------------------------------------------------------

    async def run(self, *, tools: Sequence[Any], max_turns: int = 8, **kwargs: Any) -> Response:
        """Create, run the function calls it makes, feed the outputs back, until a final answer.

        See ``nbresponses.service.function_tools.run_tools``.
        """
        return await run_tools(self, tools=tools, max_turns=max_turns, **kwargs)


def _text_config(req: CreateRequest) -> ResponseTextConfig:
    """The Response's ``text``: the format it was held to, as given."""
    if req.text_format is None:
        return ResponseTextConfig(format=ResponseFormatText(type="text"))
    return ResponseTextConfig.model_validate({"format": req.text_format})


def _stored_request(req: CreateRequest) -> dict[str, Any]:
    """The create parameters kept with a stored response (its input is kept as items)."""
    return {
        "model": req.model,
        "stream": req.stream,
        "background": req.background,
        "include": req.include,
        "logprobs": req.logprobs,
        "top_logprobs": req.top_logprobs,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "logprobs_mode": req.logprobs_mode,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "tool_choice": req.tool_choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
    }
