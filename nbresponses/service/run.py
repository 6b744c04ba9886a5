"""One response being generated: the token loop, the format's output reader, the event log.

The run drives ``TokenSource.generate`` in its own asyncio task, feeds every token to the
format's ``OutputReader`` (which writes through the run's event builder) and appends every event to
a log; nothing else writes the response or the log (the client only builds and stores it). When the
output reader has a built-in tool's answer to send (gpt-oss), the run generates again from prompt +
output + answer, within the same response and token budget. Streams (the creator's, or
``retrieve(stream=True, starting_after=N)`` readers) follow the log by sequence number, so a
late reader replays exactly the events after N and then continues live. Cancelling the task
closes the source's iterator (freeing the engine's batch row) and keeps the partial output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent

from nbresponses.families.base import OutputReader
from nbresponses.protocol.events import EventBuilder
from nbresponses.protocol.usage import build_usage
from nbresponses.tokens.contract import (
    GenerationStats,
    SamplingParams,
    TokenSource,
    stop_early,
)


@dataclass(frozen=True)
class Round:
    """What one engine request of a response gave: its tokens, how it ended, the engine's
    stats (None when it ended before its final step: cancelled, or the source failed)."""

    generated: tuple[int, ...]
    finish: str
    error: str | None = None
    stats: GenerationStats | None = None


@dataclass(frozen=True)
class Generation:
    """What the token loop needs: the token source, the prompt, sampling, and the format's
    reader of the output.

    ``params.max_tokens`` bounds the whole response: a format with built-in tools generates in
    rounds (prompt + output + tool answer, again), and all rounds share it.
    """

    source: TokenSource
    prompt_ids: Sequence[int]
    params: SamplingParams
    output_reader: Callable[[EventBuilder], OutputReader]


class ResponseRun:
    """A response in flight (or finished): the one writer of its response and its event log.

    Every event goes through the run's own builder, in order: ``created`` (and ``queued`` for
    a background response) when it is made, ``in_progress`` and the terminal event from its
    task, and between them what the format's output reader writes through the builder it was handed.
    A background response keeps its log for ``retrieve(stream=True)``; any other drops it when
    done (its readers hold it already). The slots are all it holds (``footprint_parts``).
    """

    __slots__ = (
        "_builder",
        "_changed",
        "_gen",
        "_keeps_log",
        "_on_done",
        "_output_reader",
        "_replay",
        "done",
        "events",
        "task",
        "timings",
    )

    def __init__(
        self,
        response: Response,
        generation: Generation | None = None,
        *,
        on_done: Callable[[ResponseRun], None] | None = None,
        events: Sequence[ResponseStreamEvent] = (),
        replay: Mapping[str, Any] | None = None,
        timings: Mapping[str, float] | None = None,
    ) -> None:
        """A run of ``generation`` announces ``response`` at once and generates when started;
        ``on_done(run)`` is called as it ends, before ``done`` is set (the store settles it
        before anyone sees it done). Without a generation the run is finished: ``events``
        replay, ``replay`` and ``timings`` are as stored (see ``restored``)."""
        self.events: list[ResponseStreamEvent] = list(events)
        self._builder = EventBuilder(response, self._append)
        self._gen = generation  # dropped when the run ends (see _release)
        self._output_reader = (
            None if generation is None else generation.output_reader(self._builder)
        )
        self._replay: Mapping[str, Any] = dict(replay or {})
        self._keeps_log = bool(response.background)  # only a background response replays
        self._on_done = on_done
        self._changed = asyncio.Event()
        self.done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.timings: dict[str, float] = dict(
            timings or {}
        )  # the engine's: seconds (_s) and counts (_tokens)
        if generation is None:
            self.done.set()
            return
        self._builder.created()
        if self._keeps_log:
            self._builder.queued()

    @classmethod
    def restored(
        cls,
        response: Response,
        *,
        events: Sequence[ResponseStreamEvent],
        replay: Mapping[str, Any],
        timings: Mapping[str, float],
    ) -> ResponseRun:
        """A finished run read back from the database: nothing to generate, events to replay."""
        return cls(response, events=events, replay=replay, timings=timings)

    @property
    def response(self) -> Response:
        return self._builder.response

    @property
    def id(self) -> str:
        return self._builder.response.id

    @property
    def replay(self) -> Mapping[str, Any]:
        """Output items as the model saw them, by item id (see ``OutputReader.replay``)."""
        return self._replay if self._output_reader is None else self._output_reader.replay

    def footprint_parts(self) -> list[Any]:
        """What a finished run holds, for the store's memory count (``footprint`` walks these;
        the record counts the response and its items): the run's slots, its event log, the
        items as the model saw them, the engine's timings, its task and callback, and its
        builder and two ``asyncio.Event``s with their attributes. Generation's parts (the
        source, the prompt, the output reader) are dropped by then (``_release``)."""
        helpers = (self._builder, self.done, self._changed)
        parts = [self, self.events, self._replay, self.timings, self.task, self._on_done]
        return [*parts, *helpers, *(vars(h) for h in helpers)]

    def _release(self) -> None:
        """Forget what only generation needs: the prompt ids (a chain's prompts grow with every
        turn) and the output reader's token buffers, and the log of a response that cannot be
        streamed again (its readers hold the list). A stored record then holds what the store
        measures: the response, its items and (background) its events."""
        if self._output_reader is not None:
            self._replay = dict(self._output_reader.replay)
        self._output_reader = None
        self._gen = None
        if not self._keeps_log:
            self.events = []

    def _append(self, event: ResponseStreamEvent) -> None:
        self.events.append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"nbr-{self.id}")
        self.task.add_done_callback(self._never_ran)

    def _never_ran(self, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never enters ``_run`` (so its ``finally``
        never settles the response): a stream closed right after ``response.created`` would
        wait for ``done`` forever. Settle it here as cancelled, with nothing generated."""
        if self.done.is_set() or self._gen is None:
            return
        prompt_tokens = len(self._gen.prompt_ids)
        if self._output_reader is not None:
            with contextlib.suppress(Exception):
                self._output_reader.finish(cut=True)
        usage = build_usage(
            input_tokens=prompt_tokens, cached_tokens=0, output_tokens=0, reasoning_tokens=0
        )
        self._builder.finish("cancelled", usage)
        self._settle({"wall_s": 0.0})

    def _settle(self, timings: dict[str, float]) -> None:
        """The end of every run: keep the timings, drop what only generation needs, let the
        creator store the result, then wake whoever waits."""
        self.timings = timings
        self._release()
        if self._on_done is not None:
            with contextlib.suppress(Exception):
                self._on_done(self)
        self.done.set()
        self._append_nothing()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def wait(self) -> Response:
        await self.done.wait()
        return self.response

    def follow(self, after: int = -1) -> AsyncIterator[ResponseStreamEvent]:
        """Events with sequence number > ``after``, live until the run ends.

        The reader holds the log as it is when ``follow`` is called (not at its first read):
        a finished non-background run drops its log from the store (``events = []``) while
        a stream created before may not have read it yet.
        """
        return self._follow(self.events, after)

    async def _follow(
        self, events: list[ResponseStreamEvent], after: int
    ) -> AsyncIterator[ResponseStreamEvent]:
        index = after + 1
        while True:
            changed = self._changed
            while index < len(events):
                yield events[index]
                index += 1
            if self.done.is_set():
                return
            await changed.wait()

    # -- the token loop -------------------------------------------------------------------

    async def _run(self) -> None:
        b = self._builder
        output_reader, gen = self._output_reader, self._gen
        assert output_reader is not None and gen is not None, "a run starts once"
        source = gen.source
        started = time.perf_counter()
        stats = GenerationStats()  # summed over rounds
        prompt = list(gen.prompt_ids)
        output_tokens = 0
        finish, error = "stop", None
        b.in_progress()
        try:
            while True:
                budget = min(
                    gen.params.max_tokens - output_tokens,
                    source.context_length - len(prompt),
                )
                if budget < 1:
                    finish = "length"
                    break
                params = dataclasses.replace(gen.params, max_tokens=budget)
                done = await self._round(source, output_reader, prompt, params)
                output_tokens += len(done.generated)
                stats = _add_stats(stats, done.stats, len(prompt))
                finish, error = done.finish, done.error
                if finish != "stop":
                    break
                more = await output_reader.follow_up()
                if more is None:
                    break
                prompt = [*prompt, *done.generated, *more]
        except asyncio.CancelledError:
            finish = "cancelled"
        except Exception as exc:  # a tool runner failed: this response fails, nothing else
            finish, error = "error", f"{type(exc).__name__}: {exc}"
        try:
            output_reader.finish(cut=finish != "stop")  # what is still open was cut off
            # Output is counted from the steps received (exact when the engine stops early);
            # input falls back to the rendered prompt's length if the engine did not say.
            usage = build_usage(
                input_tokens=stats.prompt_tokens or len(gen.prompt_ids),
                cached_tokens=stats.cached_tokens,
                output_tokens=output_tokens,
                reasoning_tokens=output_reader.reasoning_tokens,
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
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await output_reader.aclose()
            self._settle(_timings(stats, started))

    async def _round(
        self,
        source: TokenSource,
        output_reader: OutputReader,
        prompt: list[int],
        params: SamplingParams,
    ) -> Round:
        """One engine request, its tokens fed to the output reader."""
        try:
            steps = source.generate(prompt, params)
        except Exception as exc:  # refused (the prompt, the settings): this response fails
            return Round((), "error", f"{type(exc).__name__}: {exc}")
        generated: list[int] = []
        finish, error, stats = "stop", None, None
        try:
            async for step in steps:
                logprobs = step.logprobs or ()
                for i, token in enumerate(step.token_ids):
                    generated.append(token)
                    output_reader.feed(token, logprobs[i] if i < len(logprobs) else None)
                if step.finish_reason is not None:
                    finish, error, stats = step.finish_reason, step.error, step.stats
                    break
                if output_reader.stop:
                    # one call was asked for and it is complete (if the budget closed it, the
                    # response is cut short all the same)
                    finish = "length" if step.closed else "stop"
                    with contextlib.suppress(asyncio.CancelledError):
                        stats = await stop_early(steps)  # for the stats of the final step
                    break
        except asyncio.CancelledError:  # the response is cancelled: what came so far counts
            finish = "cancelled"
        except Exception as exc:  # the engine failed: this response fails, nothing else
            finish, error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await steps.aclose()
        return Round(tuple(generated), finish, error, stats)

    def _append_nothing(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


def _timings(stats: GenerationStats, started: float) -> dict[str, float]:
    """The engine's timings of the first round, its counts over all rounds, time to first token
    and the whole run (the ``timings`` stored with the response: seconds end in ``_s``)."""
    measured: dict[str, float | None] = {  # None: not measured, left out
        "queued_s": stats.queued_s,
        "prefill_s": stats.prefill_s,
        "draft_tokens": stats.draft_tokens or None,  # where some round drafted
        "accepted_draft_tokens": stats.accepted_draft_tokens if stats.draft_tokens else None,
        "closing_tokens": stats.closing_tokens or None,
        "guarded_tokens": stats.guarded_tokens or None,
        "total_s": stats.total_s,
    }
    timings = {k: round(v, 6) for k, v in measured.items() if v is not None}
    if stats.first_token_time is not None:
        timings["first_token_s"] = round(stats.first_token_time - started, 6)
    timings["wall_s"] = round(time.perf_counter() - started, 6)
    return timings


def _add_stats(
    total: GenerationStats, one: GenerationStats | None, prompt_tokens: int
) -> GenerationStats:
    """Usage over rounds: every round's prompt is input again (most of it cached), as OpenAI
    counts a response that called built-in tools; counts add up, times are the first round's."""
    one = one or GenerationStats()
    return GenerationStats(
        prompt_tokens=total.prompt_tokens + (one.prompt_tokens or prompt_tokens),
        cached_tokens=total.cached_tokens + one.cached_tokens,
        output_tokens=total.output_tokens + one.output_tokens,
        draft_tokens=total.draft_tokens + one.draft_tokens,
        accepted_draft_tokens=total.accepted_draft_tokens + one.accepted_draft_tokens,
        closing_tokens=total.closing_tokens + one.closing_tokens,
        guarded_tokens=total.guarded_tokens + one.guarded_tokens,
        queued_s=_first(total.queued_s, one.queued_s),
        prefill_s=_first(total.prefill_s, one.prefill_s),
        total_s=_first(total.total_s, one.total_s),
        first_token_time=_first(total.first_token_time, one.first_token_time),
    )


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b
