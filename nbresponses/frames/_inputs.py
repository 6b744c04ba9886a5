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
        and kind_of(obj[1]) == "event"
    )


def _is_group(obj: Any) -> bool:
    return isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, Mapping))


class _Collector:
    def __init__(self, lookup: ResponseLookup | None) -> None:
        self.lookup = lookup
        self.collected: list[Collected] = []
        self.stream: CollectedStream | None = None
        self.streams = 0
        self.last_seq: int | None = None

    def end_stream(self) -> None:
        self.stream = None
        self.last_seq = None

    def add_event(self, event: Any, time: float) -> None:
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
            self.add_event(obj[1], float(obj[0]))
            return
        ids = _stored_ids(obj)
        if ids is not None:
            self.add([self.find(i) for i in ids])
            return
        kind = kind_of(obj)
        if kind == "event":
            self.add_event(obj, time)
        elif kind == "response":
            self.end_stream()
            self.collected.append(CollectedResponse(obj))
        elif _is_group(obj):
            self.end_stream()
            for item in obj:
                self.add(item)
            self.end_stream()
        # anything else (unknown item or event shapes) is skipped, never fatal

    def find(self, response_id: str) -> Any:
        return (
            stored.find(response_id) if self.lookup is None else find_in([self.lookup], response_id)
        )


def collect(
    obj: Any, times: Sequence[float] | None = None, lookup: ResponseLookup | None = None
) -> list[Collected]:
    """Responses and streams found in ``obj``, in input order; ids are read through ``lookup``
    (default: the registry, ``nbresponses.traffic.lookup.stored``)."""
    if lookup is not None and not isinstance(lookup, ResponseLookup):
        raise TypeError(f"lookup= takes an object with find(response_id), not {lookup!r}")
    collector = _Collector(lookup)
    if times is None:
        collector.add(obj)
        return collector.collected
    items = [obj] if kind_of(obj) != "unknown" else list(obj)
    if len(items) != len(times):
        raise ValueError(f"times= has {len(times)} entries for {len(items)} events")
    for item, time in zip(items, times, strict=True):
        collector.add(item, math.nan if time is None else float(time))
    return collector.collected
