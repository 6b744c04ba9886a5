"""Find the token logprobs of each output_text part, in a Response or in a stream.

A stream may carry the same tokens three times: on ``response.output_text.delta`` events, on
``response.output_text.done`` and in the terminal Response. Each part is taken from exactly one
source, preferring the terminal Response, then the done event, then the deltas, so the frame
of a stream equals the frame of its folded Response.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbresponses.traffic.access import field as get
from nbresponses.traffic.events import GIVEN_METADATA, LIFECYCLE, TERMINAL

from ._inputs import Collected, CollectedResponse, CollectedStream

__all__ = ["Part", "StreamSummary", "iter_parts", "parts_of_response", "summarize_stream"]


@dataclass
class Part:
    """The logprob entries of one output_text content part (dicts or SDK objects)."""

    response_id: str | None
    item_id: str | None
    output_index: int
    content_index: int
    entries: list[Any]
    given: bool = False  # the tokens were given (a scoring), not generated


@dataclass
class _PartEvents:
    item_id: str | None = None
    deltas: list[Any] = field(default_factory=list)
    done: list[Any] | None = None


@dataclass
class StreamSummary:
    """What a stream says about its response: the latest lifecycle Response and the parts."""

    response: Any | None
    terminal: bool
    parts: dict[tuple[int, int], _PartEvents]


def is_given(response: Any) -> bool:
    """Whether a Response is a scoring of given text (see ``traffic.events.GIVEN_METADATA``)."""
    metadata = get(response, "metadata") if response is not None else None
    return bool(metadata) and get(metadata, GIVEN_METADATA) == "1"


def parts_of_response(response: Any) -> Iterator[Part]:
    """output_text parts with logprobs (and refusal parts that carry some: a Chat Completions
    refusal's ``logprobs.refusal``, as ``nbresponses.traffic.chat`` reads it); other items and
    content types are skipped."""
    rid = get(response, "id")
    given = is_given(response)
    for oi, item in enumerate(get(response, "output", ())):
        if get(item, "type") != "message":
            continue
        for ci, content in enumerate(get(item, "content", ())):
            entries = get(content, "logprobs")
            if entries and get(content, "type") in _LOGPROB_PARTS:
                yield Part(rid, get(item, "id"), oi, ci, list(entries), given)


_LOGPROB_PARTS = ("output_text", "refusal")


def summarize_stream(stream: CollectedStream) -> StreamSummary:
    """One pass over the events: lifecycle Response and per-part delta/done logprobs."""
    response: Any | None = None
    terminal = False
    parts: dict[tuple[int, int], _PartEvents] = {}
    for event in stream.events:
        kind = get(event, "type")
        if kind in LIFECYCLE:
            snapshot = get(event, "response")
            if snapshot is not None and not terminal:
                response, terminal = snapshot, kind in TERMINAL
        elif kind in ("response.output_text.delta", "response.output_text.done"):
            key = (get(event, "output_index", 0), get(event, "content_index", 0))
            part = parts.setdefault(key, _PartEvents())
            part.item_id = part.item_id or get(event, "item_id")
            logprobs = get(event, "logprobs")
            if kind == "response.output_text.done":
                part.done = list(logprobs) if logprobs else None
            elif logprobs:
                part.deltas.extend(logprobs)
    return StreamSummary(response, terminal, parts)


def _parts_of_stream(stream: CollectedStream) -> Iterator[Part]:
    summary = summarize_stream(stream)
    rid = get(summary.response, "id") if summary.response is not None else None
    final: dict[tuple[int, int], Part] = {}
    if summary.terminal:
        final = {(p.output_index, p.content_index): p for p in parts_of_response(summary.response)}
    for key in sorted(set(final) | set(summary.parts)):
        if key in final:
            yield final[key]
            continue
        events = summary.parts[key]
        entries = events.done or events.deltas
        if entries:
            yield Part(rid, events.item_id, key[0], key[1], entries, is_given(summary.response))


def iter_parts(collected: list[Collected]) -> Iterator[Part]:
    """Every output_text part with logprobs, in input order."""
    for entry in collected:
        if isinstance(entry, CollectedResponse):
            yield from parts_of_response(entry.response)
        else:
            yield from _parts_of_stream(entry)
