"""A stream as a timeline, one row per event, for latency analysis."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.access import field
from nbresponses.traffic.lookup import ResponseLookup

from ._columns import categorical, nullable_int
from ._inputs import CollectedStream, collect
from ._streams import first_time, stream_response_id

__all__ = ["EVENTS_COLUMNS", "events_frame"]

#: column -> dtype of :func:`events_frame`
EVENTS_COLUMNS: dict[str, str] = {
    "stream": "int32",
    "response_id": "category",
    "sequence_number": "Int64",
    "type": "category",
    "item_id": "category",
    "output_index": "Int32",
    "content_index": "Int32",
    "delta_len": "Int32",
    "n_logprobs": "Int32",
    "time": "float64",
    "elapsed": "float64",
}


def _length(value: Any) -> float:
    return float(len(value)) if isinstance(value, (str, list, tuple)) else math.nan


def _number(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else math.nan
    )


def events_frame(
    events: Any, *, times: Iterable[float] | None = None, lookup: ResponseLookup | None = None
) -> pd.DataFrame:
    """One row per stream event, in arrival order (RangeIndex).

    ``events``: an iterable of events (SDK objects or JSON dicts); ``times=`` an optional
    parallel sequence of receive times in seconds on any clock (e.g. ``time.perf_counter()``
    taken as each event arrived); ``(time, event)`` pairs work too. Several streams may be
    concatenated or nested; ``stream`` numbers them. Responses in the input (stored ids too,
    read through ``lookup=`` as for :func:`logprobs_frame`) have no events and are skipped.
    Columns and dtypes are :data:`EVENTS_COLUMNS`: ``delta_len`` is the length in
    characters of a ``delta`` string, ``n_logprobs`` the number of token logprobs an event
    carries, ``elapsed`` the time since the stream's first event.

    Inter-token latency, in one line::

        ev[ev.type == "response.output_text.delta"].groupby("stream").time.diff()
    """
    streams = [
        s
        for s in collect(events, None if times is None else list(times), lookup)
        if isinstance(s, CollectedStream)
    ]
    rows: dict[str, list[Any]] = {name: [] for name in EVENTS_COLUMNS}
    for stream in streams:
        rid = stream_response_id(stream)
        start = first_time(stream.times)
        for event, time in zip(stream.events, stream.times, strict=True):
            rows["stream"].append(stream.index)
            rows["response_id"].append(rid)
            rows["sequence_number"].append(_number(field(event, "sequence_number")))
            rows["type"].append(field(event, "type"))
            item_id = field(event, "item_id") or field(field(event, "item"), "id")
            rows["item_id"].append(item_id)
            rows["output_index"].append(_number(field(event, "output_index")))
            rows["content_index"].append(_number(field(event, "content_index")))
            rows["delta_len"].append(_length(field(event, "delta")))
            rows["n_logprobs"].append(_length(field(event, "logprobs")))
            rows["time"].append(time)
            rows["elapsed"].append(time - start)
    as_float = {
        k: np.array(v, dtype=np.float64)
        for k, v in rows.items()
        if k not in ("response_id", "type", "item_id")
    }
    columns = {
        "stream": np.array(rows["stream"], dtype=np.int32),
        "response_id": categorical(rows["response_id"]),
        "sequence_number": nullable_int(as_float["sequence_number"], "Int64"),
        "type": categorical(rows["type"]),
        "item_id": categorical(rows["item_id"]),
        "output_index": nullable_int(as_float["output_index"], "Int32"),
        "content_index": nullable_int(as_float["content_index"], "Int32"),
        "delta_len": nullable_int(as_float["delta_len"], "Int32"),
        "n_logprobs": nullable_int(as_float["n_logprobs"], "Int32"),
        "time": as_float["time"],
        "elapsed": as_float["elapsed"],
    }
    return pd.DataFrame(columns, copy=False)
