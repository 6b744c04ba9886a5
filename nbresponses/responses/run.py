"""One response being generated: the token loop, the parser, the event log its readers follow.

The run drives ``TokenSource.generate`` in its own asyncio task and appends every event to a
log. Streams (the creator's, or ``retrieve(stream=True, starting_after=N)`` readers) follow the
log by sequence number, so a late reader replays exactly the events after N and then continues
live. Cancelling the task closes the source's iterator (freeing the engine's batch row) and
keeps the partial output.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent

from nbresponses.engine.types import GenerationStats, SamplingParams, TokenSource
from nbresponses.engine.types import TokenLogprob as EngineLogprob
from nbresponses.formats.detokenize import IncrementalDetokenizer, TokenBytes
from nbresponses.formats.parser import Delta, End, Event, Start, StreamParser
from nbresponses.responses.events import EventBuilder, TokenLogprob
from nbresponses.responses.usage import build_usage


@dataclass(frozen=True)
class Generation:
    """What the token loop needs: the prompt, sampling, and how to read the output."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    prefill: str
    tools: bool
    parallel_tool_calls: bool


class ResponseRun:
    """A response in flight (or finished): its builder, event log and generation task."""

    def __init__(
        self,
        response: Response,
        source: TokenSource,
        tokenizer: Any,
        token_bytes: TokenBytes,
        generation: Generation,
    ) -> None:
        self.events: list[ResponseStreamEvent] = []
        self.builder = EventBuilder(response, self._append)
        self._source = source
        self._tokenizer = tokenizer
        self._bytes = token_bytes
        self._gen = generation
        self._changed = asyncio.Event()
        self.done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.keep_events = True

    @property
    def response(self) -> Response:
        return self.builder.response

    @property
    def id(self) -> str:
        return self.builder.response.id

    def _append(self, event: ResponseStreamEvent) -> None:
        self.events.append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"nbr-{self.id}")

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def wait(self) -> Response:
        await self.done.wait()
        return self.response

    async def follow(self, after: int = -1) -> AsyncIterator[ResponseStreamEvent]:
        """Events with sequence number > ``after``, live until the run ends."""
        index = after + 1
        while True:
            changed = self._changed
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.done.is_set():
                return
            await changed.wait()

    # -- the token loop -------------------------------------------------------------------

    async def _run(self) -> None:
        b = self.builder
        gen = self._gen
        stats = GenerationStats()
        detok = IncrementalDetokenizer(self._tokenizer)
        parser = StreamParser(tools=gen.tools, prefill=gen.prefill)
        eos = set(self._source.eos_token_ids)
        pending: deque[tuple[int, TokenLogprob | None]] = deque()  # (text start, logprob)
        counts = {"output": 0, "reasoning": 0}
        carry: list[TokenLogprob] = []  # text logprobs waiting for the next text delta
        calls = 0
        finish, error = "stop", None
        cut = False  # set at the end when generation stopped before the model finished

        def take(end: int) -> list[TokenLogprob | None]:
            taken = []
            while pending and pending[0][0] < end:
                taken.append(pending.popleft()[1])
            return taken

        def handle(events: list[Event]) -> None:
            nonlocal calls
            for ev in events:
                taken = take(ev.end)
                if ev.kind == "reasoning":
                    counts["reasoning"] += len(taken)
                elif ev.kind == "text" and isinstance(ev, Delta):
                    # tokens before a text Start were trimmed whitespace: not part of the text
                    carry.extend(lp for lp in taken if lp is not None)
                if isinstance(ev, Start):
                    if ev.kind == "text":
                        b.open_message()
                    elif ev.kind == "reasoning":
                        b.open_reasoning()
                    else:
                        b.open_call(ev.name)
                elif isinstance(ev, Delta):
                    if ev.kind == "text":
                        b.text_delta(ev.text, carry[:])
                        carry.clear()
                    elif ev.kind == "reasoning":
                        b.reasoning_delta(ev.text)
                    else:
                        b.arguments_delta(ev.text)
                elif isinstance(ev, End):
                    if ev.kind == "tool_call":
                        b.close_call(ev.arguments, "completed" if ev.valid else "incomplete")
                        calls += 1
                    else:
                        b.close("incomplete" if cut else "completed")
                    carry.clear()

        b.in_progress()
        steps = self._source.generate(gen.prompt_ids, gen.params, stats)
        try:
            async for step in steps:
                logprobs = step.logprobs or ()
                for i, token in enumerate(step.token_ids):
                    counts["output"] += 1
                    if token in eos:
                        continue
                    lp = self._logprob(logprobs[i]) if i < len(logprobs) else None
                    pending.append((len(detok.text), lp))
                    text = detok.push(token)
                    if text:
                        handle(parser.feed(text))
                if step.finish_reason is not None:
                    finish, error = step.finish_reason, step.error
                    break
                if calls and not gen.parallel_tool_calls:
                    break  # one call was asked for and it is complete
        except asyncio.CancelledError:
            finish = "cancelled"
        except Exception as exc:  # the engine failed: this response fails, nothing else
            finish, error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await steps.aclose()  # type: ignore[attr-defined]
        try:
            tail = detok.flush()
            events = parser.feed(tail) if tail else []
            events += parser.finish()
            cut = finish != "stop"  # what is still open was cut off
            handle(events)
            take(1 << 62)
            usage = build_usage(
                stats,
                prompt_tokens=len(gen.prompt_ids),
                output_tokens=counts["output"],
                reasoning_tokens=counts["reasoning"],
            )
            if finish == "stop":
                b.finish("completed", usage)
            elif finish == "length":
                b.finish("incomplete", usage, incomplete_reason="max_output_tokens")
            elif finish == "cancelled":
                b.finish("cancelled", usage)
            else:
                b.finish("failed", usage, error=error)
        finally:
            self.done.set()
            self._append_nothing()

    def _append_nothing(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _logprob(self, lp: EngineLogprob) -> TokenLogprob:
        token, raw = self._bytes.get(lp.token_id)
        top = [(*self._bytes.get(t), v) for t, v in lp.top]
        return TokenLogprob(token=token, bytes=raw, logprob=float(lp.logprob), top=top)
