"""Per-stream facts shared by the events and usage frames: response id and receive times."""

from __future__ import annotations

import math
from typing import Any

from nbresponses.traffic.access import field
from nbresponses.traffic.events import snapshot_rank

from ._inputs import CollectedStream

__all__ = ["first_time", "stream_response", "stream_response_id"]


def stream_response(stream: CollectedStream) -> Any | None:
    """The most final Response snapshot the stream carries (terminal > in_progress > created)."""
    best, best_rank = None, -1
    for event in stream.events:
        rank = snapshot_rank(field(event, "type"))
        snapshot = field(event, "response")
        if rank >= best_rank and rank >= 0 and snapshot is not None:
            best, best_rank = snapshot, rank
    return best


def stream_response_id(stream: CollectedStream) -> str | None:
    """The id of the first Response snapshot in the stream (lifecycle events carry one)."""
    for event in stream.events:
        snapshot = field(event, "response")
        if snapshot is not None and field(snapshot, "id") is not None:
            return field(snapshot, "id")
    return None


def first_time(times: list[float]) -> float:
    """The first known receive time (NaN when none is)."""
    return next((t for t in times if not math.isnan(t)), math.nan)
