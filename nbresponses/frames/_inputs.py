"""Turn whatever a user hands a frame function into Responses and streams.

Accepted: a Response; a stream event; an iterable of any of these, nested iterables (each one
its own group), and ``(receive_time, event)`` pairs. Receive times may instead come as a
``times=`` sequence parallel to a flat iterable. Consecutive events form streams; a stream
ends where the next one begins (``response.created``/``response.queued``, or a
``sequence_number`` that does not increase), so concatenated recordings split correctly.
A stored response's id (``"resp_..."``), a list of ids or an ``nbr.history()`` frame (its
``id`` column) are read through ``lookup=`` when given, else through the process's registry
(``nbresponses.traffic.lookup.stored``), where every response store registers itself: frames
never import the store, and an id found nowhere is a KeyError naming it, however the frames
were imported.

Chat Completions and legacy Completions traffic is read here too, through
``nbresponses.traffic.chat`` (the view's reading as well): a ``ChatCompletion`` or a
``Completion`` becomes the Response of its choice ``choice``, and consecutive chunks of one
stream (``chat.completion.chunk`` objects, the SDK's ``ChatCompletionStream`` events, or
``text_completion`` chunks sharing an id) become that answer's Responses stream. A lone
``text_completion`` is a whole Completion.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import pandas as pd

from nbresponses.traffic.access import field as get
from nbresponses.traffic.access import kind_of
from nbresponses.traffic.chat import (
    CHAT,
    CHUNK,
    TEXT,
    ChoiceReader,
    as_response,
    chunk_of,
    shape_of,
)
from nbresponses.traffic.events import STARTED
from nbresponses.traffic.lookup import ResponseLookup, find_in, stored

__all__ = ["Collected", "CollectedResponse", "CollectedStream", "collect"]


def _stored_ids(obj: Any) -> list[str] | None:
    """The response ids ``obj`` names (an id, a ``history()`` frame or its ``id`` column), or
    None when it names none."""
    if isinstance(obj, str):
        return [obj] if obj.startswith("resp_") else None
    if isinstance(obj, pd.DataFrame) and "id" in obj.columns:
        return [str(i) for i in obj["id"]]
    if isinstance(obj, pd.Series) and obj.name == "id":
        return [str(i) for i in obj]
    return None


@dataclass
class CollectedResponse:
    """A complete (non-streamed, or already folded) Response."""

    response: Any


@dataclass
class CollectedStream:
    """The events of one stream in arrival order, with receive times (NaN when unknown)."""

    index: int
    events: list[Any] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


Collected = CollectedResponse | CollectedStream


def _is_pair(obj: Any) -> bool:
    return (
        isinstance(obj, tuple)
        and len(obj) == 2
        and isinstance(obj[0], Real)
        and not isinstance(obj[0], bool)
        and (kind_of(obj[1]) == "event" or _is_chunk(obj[1]))
    )


def _is_chunk(obj: Any) -> bool:
    return shape_of(chunk_of(obj)) in (CHUNK, TEXT)


def _is_single(obj: Any) -> bool:
    """One event, Response or answer (rather than an iterable of them)."""
    return kind_of(obj) != "unknown" or shape_of(chunk_of(obj)) is not None


def _is_group(obj: Any) -> bool:
    """An iterable of inputs; not a string, a dict, or a model of an event frames skip (pydantic
    models iterate over their fields)."""
    return (
        isinstance(obj, Iterable)
        and not isinstance(obj, (str, bytes, Mapping))
        and not hasattr(obj, "model_dump")
    )


@dataclass
class _ChunkStream:
    """The chunks of one Chat Completions or Completions stream, with their receive times."""

    id: Any
    chunks: list[Any] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


def _choice_indexes(objs: list[Any]) -> list[int]:
    """The choice indexes an answer's objects (a whole answer, or a stream's chunks) carry."""
    return sorted(
        {get(c, "index", i) for obj in objs for i, c in enumerate(get(obj, "choices", ()))}
    )


def _with_choice(response: dict[str, Any], index: int, several: bool) -> dict[str, Any]:
    """A choice's Response; when every choice is read, its id names the choice (``#index``)."""
    if several and response.get("id") is not None:
        response["id"] = f"{response['id']}#{index}"
    return response


class _Collector:
    def __init__(self, lookup: ResponseLookup | None, choice: int | None = 0) -> None:
        self.lookup = lookup
        self.choice = choice
        self.chunks: _ChunkStream | None = None
        self.collected: list[Collected] = []
        self.stream: CollectedStream | None = None
        self.streams = 0
        self.last_seq: int | None = None

    def end_stream(self) -> None:
        self.stream = None
        self.last_seq = None
        self.end_chunks()

    def choices(self, objs: list[Any]) -> tuple[list[int], bool]:
        """Which choices to read (``choice=None``: every one) and whether there are several."""
        if self.choice is not None:
            return [self.choice], False
        indexes = _choice_indexes(objs) or [0]
        return indexes, len(indexes) > 1

    def add_answer(self, obj: Any) -> None:
        """A whole ChatCompletion or Completion: the Response of each choice read."""
        indexes, several = self.choices([obj])
        for index in indexes:
            response = _with_choice(as_response(obj, index), index, several)
            self.collected.append(CollectedResponse(response))

    def end_chunks(self) -> None:
        """The chunk stream read so far ends: its events, for each choice read (a lone
        Completion is a whole answer: read as one)."""
        chunks, self.chunks = self.chunks, None
        if chunks is None:
            return
        if len(chunks.chunks) == 1 and shape_of(chunks.chunks[0]) == TEXT:
            self.add_answer(chunks.chunks[0])
            return
        indexes, several = self.choices(chunks.chunks)
        for index in indexes:
            reader = ChoiceReader(index)
            stream = CollectedStream(index=self.streams)
            self.streams += 1
            for chunk, time in zip(chunks.chunks, chunks.times, strict=True):
                events = reader.feed(chunk)
                stream.events += events
                stream.times += [time] * len(events)
            events = reader.finish()
            stream.events += events
            stream.times += [chunks.times[-1]] * len(events)
            if several:
                for event in stream.events:
                    snapshot = get(event, "response")
                    if snapshot is not None:
                        _with_choice(snapshot, index, several)
            self.collected.append(stream)

    def add_chunk(self, chunk: Any, time: float) -> None:
        if self.stream is not None:
            self.stream = None
            self.last_seq = None
        if self.chunks is not None and get(chunk, "id") != self.chunks.id:
            self.end_chunks()
        if self.chunks is None:
            self.chunks = _ChunkStream(get(chunk, "id"))
        self.chunks.chunks.append(chunk)
        self.chunks.times.append(time)

    def add_event(self, event: Any, time: float) -> None:
        if self.chunks is not None:
            self.end_chunks()
        seq = get(event, "sequence_number")
        restart = self.last_seq is not None and isinstance(seq, int) and seq <= self.last_seq
        if self.stream is not None and (restart or get(event, "type") in STARTED):
            self.end_stream()
        if self.stream is None:
            self.stream = CollectedStream(index=self.streams)
            self.streams += 1
            self.collected.append(self.stream)
        self.stream.events.append(event)
        self.stream.times.append(time)
        if isinstance(seq, int):
            self.last_seq = seq

    def add(self, obj: Any, time: float = math.nan) -> None:
        if _is_pair(obj):
            self.add(obj[1], float(obj[0]))
            return
        ids = _stored_ids(obj)
        if ids is not None:
            self.add([self.find(i) for i in ids])
            return
        kind = kind_of(obj)  # Responses traffic first: the per-event path of long streams
        if kind == "event":
            self.add_event(obj, time)
            return
        if kind == "response":
            self.end_stream()
            self.collected.append(CollectedResponse(obj))
            return
        obj = chunk_of(obj)
        shape = shape_of(obj)
        if shape in (CHUNK, TEXT):
            self.add_chunk(obj, time)
        elif shape == CHAT:
            self.end_stream()
            self.add_answer(obj)
        elif _is_group(obj):
            self.end_stream()
            for item in obj:
                self.add(item)
            self.end_stream()
        elif hasattr(obj, "__aiter__"):
            raise TypeError(
                "an async stream cannot be read here without blocking the event loop: "
                "collect it first (events = [e async for e in stream]) and pass the list"
            )
        # anything else (unknown item or event shapes) is skipped, never fatal

    def find(self, response_id: str) -> Any:
        return (
            stored.find(response_id) if self.lookup is None else find_in([self.lookup], response_id)
        )


def collect(
    obj: Any,
    times: Sequence[float] | None = None,
    lookup: ResponseLookup | None = None,
    choice: int | None = 0,
) -> list[Collected]:
    """Responses and streams found in ``obj``, in input order; ids are read through ``lookup``
    (default: the registry, ``nbresponses.traffic.lookup.stored``); ``choice``: which choice
    of a Chat Completions or Completions answer is read (``n > 1`` gives several); None
    reads every choice, each a Response of its own, whose id ends in ``#index`` when there
    are several."""
    if lookup is not None and not isinstance(lookup, ResponseLookup):
        raise TypeError(f"lookup= takes an object with find(response_id), not {lookup!r}")
    if choice is not None and (
        not isinstance(choice, int) or isinstance(choice, bool) or choice < 0
    ):
        raise ValueError(f"choice= takes a choice index (0, 1, ...) or None, not {choice!r}")
    collector = _Collector(lookup, choice)
    if times is None:
        collector.add(obj)
        collector.end_stream()
        return collector.collected
    items = [obj] if _is_single(obj) else list(obj)
    if len(items) != len(times):
        raise ValueError(f"times= has {len(times)} entries for {len(items)} events")
    for item, time in zip(items, times, strict=True):
        collector.add(item, math.nan if time is None else float(time))
    collector.end_stream()
    return collector.collected
