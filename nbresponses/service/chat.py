"""Chat Completions on the local engine: ``client.chat.completions.create(...)``.

A thin adapter over the Responses path: each choice is one ``ResponseRun`` of the request's
Responses form (``protocol/chat.py`` builds it), rendered, generated and read by the model
family exactly as ``responses.create`` would, so a conversation's tokens and logprobs are the
same whichever API carries it. This module only reads each run's events and writes them as
Chat's objects: ``ChatCompletionChunk``s as OpenAI streams them (a first chunk with the role,
content and tool-call deltas, a last chunk with the ``finish_reason``, and with
``stream_options.include_usage`` a chunk with no choices and the usage), or one
``ChatCompletion`` folded from the same pieces.

``n`` choices are admitted together (one prefill of the shared prompt). With ``n == 1`` the
request's ``seed`` is the choice's; with ``n > 1`` choice ``i`` is drawn with
``nbresponses.runtime.sampling.derived_seeds(seed, n)[i]``, as ``engine.sample`` draws its
completions, so it equals the same request made alone with that seed. ``stop`` strings cut
the content where the first one starts (the run is stopped there, ``finish_reason="stop"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseFunctionToolCall

from nbresponses.families.base import (
    Family,
    OutputReader,
    ReaderFactory,
    ReaderWrap,
    RenderedPrompt,
)
from nbresponses.protocol import chat as shapes
from nbresponses.protocol import completions as completion_shapes
from nbresponses.protocol.chat import ChatRequest, FinishReason, ToolCall
from nbresponses.protocol.completions import TokenEntry
from nbresponses.protocol.errors import server_error
from nbresponses.protocol.events import EventBuilder, TokenLogprob
from nbresponses.protocol.generation import Sampling, check_token_ids
from nbresponses.protocol.request import CreateRequest
from nbresponses.service.run import ResponseRun
from nbresponses.service.scoring import Scoring
from nbresponses.service.stream import AsyncStream, Interleaved
from nbresponses.tokens.contract import TokenIdLogprob, TokenSource

if TYPE_CHECKING:
    from nbresponses.service.completions import AsyncCompletions


class ResponseStarter(Protocol):
    """What the adapter needs of ``client.responses`` (``AsyncResponses``): the token source
    and a run started from a validated request. A protocol, so that the client, which holds
    this adapter as ``client.chat``, is not imported back here."""

    @property
    def source(self) -> TokenSource: ...

    def start(
        self,
        req: CreateRequest,
        *,
        sampling: Sampling | None = None,
        reader: ReaderWrap | None = None,
    ) -> ResponseRun: ...


class _Counter:
    """Counts the tokens a run's output reader is fed (vLLM's ``continuous_usage_stats``)."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.tokens = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def wrap(self, prompt: RenderedPrompt) -> ReaderFactory:
        self.prompt_ids = list(prompt.ids)

        def make(builder: EventBuilder) -> OutputReader:
            return _CountedReader(prompt.output_reader(builder), self)

        return make


class _CountedReader:
    """An output reader that counts what it is fed and otherwise is the family's own."""

    def __init__(self, inner: OutputReader, counter: _Counter) -> None:
        self._inner = inner
        self._counter = counter

    def feed(self, token_id: int, logprob: TokenIdLogprob | None) -> None:
        self._counter.tokens += 1
        self._inner.feed(token_id, logprob)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class _Piece:
    """What one choice adds to a chunk."""

    role: bool = False
    content: str | None = None
    reasoning: str | None = None
    calls: list[tuple[ToolCall, bool, str]] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None

    @property
    def empty(self) -> bool:
        return not (self.role or self.content or self.reasoning or self.calls or self.logprobs)


def _logprob(lp: Any) -> TokenLogprob:
    """A Responses output-text logprob (with its bytes) as the protocol's ``TokenLogprob``."""
    extra = lp.model_extra or {}
    return TokenLogprob(
        token=lp.token,
        bytes=list(lp.bytes),
        logprob=lp.logprob,
        top=[(t.token, list(t.bytes), t.logprob) for t in lp.top_logprobs],
        processed_logprob=extra.get("processed_logprob"),
    )


class _Choice:
    """One choice: a run's events as chat pieces (content held back where a stop may start)."""

    def __init__(self, req: ChatRequest, index: int, run: ResponseRun, counter: _Counter) -> None:
        self.req = req
        self.index = index
        self.run = run
        self.counter = counter
        self.calls: list[ToolCall] = []
        self.stopped = False  # a stop string ended it
        self._text = ""  # content generated so far
        self._sent = 0  # characters of it already sent
        self._held: list[tuple[int, TokenLogprob]] = []  # (where its text starts, logprob)
        self._read: dict[int, int] = {}  # output index -> logprobs of that message read

    async def pieces(self) -> AsyncIterator[_Piece]:
        yield _Piece(role=True, content=self.req.echo_text)
        async for event in self.run.follow():
            piece = self._piece(event)
            if piece is not None and not piece.empty:
                yield piece
            if self.stopped:
                self.run.cancel()
                await self.run.wait()
                break
        yield self._last()

    def _piece(self, event: Any) -> _Piece | None:
        kind = event.type
        if kind == "response.output_text.delta":
            return self._content(event)
        if kind == "response.reasoning_text.delta":
            return _Piece(reasoning=event.delta)
        if kind == "response.output_item.added" and isinstance(
            event.item, ResponseFunctionToolCall
        ):
            call = ToolCall(len(self.calls), event.item.call_id, event.item.name)
            self.calls.append(call)
            return _Piece(calls=[(call, True, "")])
        if kind == "response.function_call_arguments.delta" and self.calls:
            call = self.calls[-1]
            call.arguments += event.delta
            return _Piece(calls=[(call, False, event.delta)])
        return None

    def _content(self, event: Any) -> _Piece:
        """A text delta, its logprobs read (with their bytes) from the live message."""
        start = len(self._text)
        self._text += event.delta
        if self.req.logprobs:
            part = self.run.response.output[event.output_index].content[0]
            read = self._read.get(event.output_index, 0)
            taken = (part.logprobs or [])[read : read + len(event.logprobs)]
            self._read[event.output_index] = read + len(taken)
            self._held.extend((start, _logprob(lp)) for lp in taken)
        stops = self.req.stop
        hit = _find_stop(self._text, stops)
        if hit is not None:
            self.stopped = True
            return self._release(hit)
        return self._release(len(self._text) - _held_back(self._text, stops))

    def _release(self, end: int) -> _Piece:
        """Send the content up to ``end`` and the logprobs of the tokens that start before it."""
        piece = _Piece(content=self._text[self._sent : end] or None)
        self._sent = max(self._sent, end)
        if self.req.logprobs:
            ready = [lp for start, lp in self._held if start < end or not self.req.stop]
            self._held = self._held[len(ready) :]
            piece.logprobs = ready
        return piece

    def _last(self) -> _Piece:
        """The finish reason (and what a possible stop held back, when none came)."""
        response = self.run.response
        piece = _Piece() if self.stopped else self._release(len(self._text))
        if response.status == "failed":
            message = response.error.message if response.error else "the engine failed"
            raise server_error(f"The engine stopped: {message}")
        if self.stopped:
            piece.finish_reason = "stop"
        elif response.status == "incomplete":
            piece.finish_reason = "length"
        elif self.calls:
            piece.finish_reason = "tool_calls"
        else:
            piece.finish_reason = "stop"
        return piece

    def usage(self) -> tuple[int, int, int, int]:
        """(prompt, completion, cached, reasoning) tokens of this choice (while it runs: the
        prompt as rendered and the tokens generated so far)."""
        u = self.run.response.usage
        if u is None:
            return self.counter.prompt_tokens, self.counter.tokens, 0, 0
        return (
            u.input_tokens,
            u.output_tokens,
            u.input_tokens_details.cached_tokens,
            u.output_tokens_details.reasoning_tokens,
        )


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string starts in ``text`` (None: none there)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that may begin a stop string (held until the next
    delta says whether it completes)."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return held


def _usage(choices: Sequence[_Choice]) -> Any:
    """The prompt once (the choices share it), the completions summed, as OpenAI counts n."""
    counts = [c.usage() for c in choices]
    return shapes.usage(
        prompt_tokens=counts[0][0],
        completion_tokens=sum(c[1] for c in counts),
        cached_tokens=counts[0][2],
        reasoning_tokens=sum(c[3] for c in counts),
    )


class ChatCompletionStream(AsyncStream[ChatCompletionChunk]):
    """A streamed ``chat.completions.create``: ``ChatCompletionChunk``s as OpenAI sends them.

    Closing the stream stops the generations still running.
    """

    def __init__(self, model: str, req: ChatRequest, choices: list[_Choice]) -> None:
        self._model = model
        self._req = req
        self._choices = choices
        self._id, self._created = shapes.new_chat_id()
        self._pieces: Interleaved[_Choice, _Piece] = Interleaved(choices, _Choice.pieces)
        self._iterator = self._chunks()

    def _chunk(self, choices: list[Any], usage: Any = None) -> ChatCompletionChunk:
        return shapes.chunk(
            self._id,
            self._created,
            self._model,
            choices,
            with_usage=self._req.include_usage,
            usage=usage,
        )

    async def _chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        async for choice, piece in self._pieces:
            usage = _usage(self._choices) if self._req.options.usage_on_every_chunk else None
            yield self._chunk([_delta(choice, piece)], usage)
        if self._req.include_usage:
            yield self._chunk([], _usage(self._choices))

    async def cancel(self) -> None:
        """Stop the generations now; the stream ends after the chunks already made."""
        await self._stop()

    async def close(self) -> None:
        """Stop reading and stop the generations still running."""
        await self._iterator.aclose()  # type: ignore[attr-defined]
        await self._stop()

    async def _stop(self) -> None:
        await _stop(self._choices, self._pieces.tasks)


def _delta(choice: _Choice, piece: _Piece) -> Any:
    return shapes.delta_choice(
        choice.index,
        role=piece.role,
        content=piece.content,
        reasoning=piece.reasoning,
        calls=piece.calls,
        logprobs=piece.logprobs if choice.req.logprobs else None,
        finish_reason=piece.finish_reason,
    )


async def _stop(choices: Sequence[_Choice], tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel the readers, then the generations, and wait for both to end."""
    for task in tasks:
        task.cancel()
    for choice in choices:
        choice.run.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(c.run.wait() for c in choices), return_exceptions=True)


async def _fold(choice: _Choice) -> Any:
    """A choice's pieces as one finished choice."""
    content: list[str] = []
    reasoning: list[str] = []
    logprobs: list[TokenLogprob] = []
    finish: FinishReason = "stop"
    async for piece in choice.pieces():
        content.append(piece.content or "")
        reasoning.append(piece.reasoning or "")
        logprobs.extend(piece.logprobs or [])
        finish = piece.finish_reason or finish
    calls = choice.calls
    if finish == "length" and calls and not shapes.arguments_json(calls[-1].arguments):
        calls = calls[:-1]  # the budget cut this call: never return broken arguments
    text = "".join(content)
    return shapes.choice(
        choice.index,
        content=text if text or not calls else None,
        reasoning="".join(reasoning) or None,
        calls=calls,
        finish_reason=finish,
        logprobs=logprobs if choice.req.logprobs else None,
    )


class AsyncChatCompletions:
    """``client.chat.completions``: ``create`` as ``openai.AsyncOpenAI().chat.completions``."""

    def __init__(self, responses: ResponseStarter, completions: AsyncCompletions) -> None:
        self._responses = responses
        self._completions = completions  # the scorer and vocabulary the Completions API reads
        self.model = completions.model

    async def _prompt_logprobs(self, ids: list[int], top: int) -> list[Any]:
        """vLLM's ``prompt_logprobs`` of the rendered prompt: the engine's scoring, as the
        Completions API's ``prompt_logprobs`` gives them for the same ids."""
        family = self._completions.family
        scored: list[TokenIdLogprob | None] = [None] * len(ids)
        if len(ids) > 1:
            job = Scoring(ids[:1], ids[1:])
            logprobs, _ = await self._completions.scorer.logprobs(job, top_logprobs=top,
                                                                  method="prefill")  # fmt: skip
            scored = [None, *logprobs]
        return completion_shapes.prompt_logprobs(
            [_entry(family, i, lp) for i, lp in zip(ids, scored, strict=True)], top
        )

    def _start(self, req: ChatRequest) -> list[_Choice]:
        """One run per choice, admitted together so they share the prompt's prefill."""
        check_token_ids(req.sampling.logit_bias, self._completions.vocab_size())
        create, n = req.create, req.n
        seeds = req.choice_seeds()
        source = self._responses.source
        together = getattr(source, "together", None)
        gate = together(n) if n > 1 and together is not None else None
        runs: list[ResponseRun] = []
        counters = [_Counter() for _ in seeds]
        try:
            for seed, counter in zip(seeds, counters, strict=True):
                one = dataclasses.replace(create, seed=seed)
                sampling = dataclasses.replace(req.sampling, seed=seed)
                runs.append(self._responses.start(one, sampling=sampling, reader=counter.wrap))
        except BaseException:
            for run in runs:
                run.cancel()
            if gate is not None:
                gate.release()
            raise
        if gate is not None:
            # each run asks the engine on its task's first step: release what the gate holds
            # after those steps (it releases by itself once all n came)
            asyncio.get_running_loop().call_soon(gate.release)
        return [
            _Choice(req, i, run, c) for i, (run, c) in enumerate(zip(runs, counters, strict=True))
        ]

    async def create(self, **kwargs: Any) -> ChatCompletion | ChatCompletionStream:
        """A ``ChatCompletion`` (or a ``ChatCompletionStream`` of chunks with ``stream=True``)."""
        req = shapes.parse_chat(kwargs, model=self.model)
        choices = self._start(req)
        if req.stream:
            return ChatCompletionStream(self.model, req, choices)
        chat_id, created = shapes.new_chat_id()
        tasks = [asyncio.ensure_future(_fold(c)) for c in choices]
        try:
            prompt = None
            if req.prompt_logprobs is not None:
                ids = choices[0].counter.prompt_ids
                prompt = await self._prompt_logprobs(ids, req.prompt_logprobs)
            folded = await asyncio.gather(*tasks)
        finally:
            if not all(t.done() for t in tasks):  # one failed, or we were cancelled
                with contextlib.suppress(Exception):
                    await _stop(choices, [t for t in tasks if not t.done()])
        usage = _usage(choices)
        return shapes.completion(chat_id, created, self.model, list(folded), usage, prompt)


class AsyncChat:
    """``client.chat``, holding ``completions`` as the SDK does."""

    def __init__(self, responses: ResponseStarter, completions: AsyncCompletions) -> None:
        self.completions = AsyncChatCompletions(responses, completions)


def _entry(family: Family, token_id: int, lp: TokenIdLogprob | None) -> TokenEntry:
    """A prompt token as the Completions shapes read it (its string; its logprob when scored)."""
    if lp is None:
        return TokenEntry(
            id=token_id, token=family.token_logprob(TokenIdLogprob(token_id, 0.0)).token, offset=0
        )
    given = family.token_logprob(lp)
    return TokenEntry(
        id=token_id,
        token=given.token,
        offset=0,
        logprob=given,
        top_ids=tuple(t for t, _ in lp.top),
        rank=lp.rank,
        entropy=lp.entropy,
    )
