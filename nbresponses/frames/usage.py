"""Token usage and stream timing, one row per response."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.access import field
from nbresponses.traffic.lookup import ResponseLookup

from ._columns import categorical, nullable_int, string
from ._inputs import CollectedResponse, CollectedStream, collect
from ._streams import first_time, stream_response

__all__ = ["USAGE_COLUMNS", "usage_frame"]

#: column -> dtype of :func:`usage_frame`
USAGE_COLUMNS: dict[str, str] = {
    "response_id": "str",
    "model": "category",
    "status": "category",
    "created_at": "datetime64[ns, UTC]",
    "completed_at": "datetime64[ns, UTC]",
    "input_tokens": "Int64",
    "cached_tokens": "Int64",
    "output_tokens": "Int64",
    "reasoning_tokens": "Int64",
    "total_tokens": "Int64",
    "streamed": "bool",
    "ttft_s": "float64",
    "duration_s": "float64",
    "tokens_per_s": "float64",
    "temperature": "float64",
    "top_p": "float64",
    "seed": "Int64",
}

_TOKENS = {
    "input_tokens": ("input_tokens",),
    "cached_tokens": ("input_tokens_details", "cached_tokens"),
    "output_tokens": ("output_tokens",),
    "reasoning_tokens": ("output_tokens_details", "reasoning_tokens"),
    "total_tokens": ("total_tokens",),
}


def _dig(obj: Any, path: tuple[str, ...]) -> float:
    for name in path:
        obj = field(obj, name)
    return float(obj) if isinstance(obj, (int, float)) else math.nan


def _timing(stream: CollectedStream, output_tokens: float) -> tuple[float, float, float]:
    """Time to first token, duration, and output tokens per second after the first token."""
    start = first_time(stream.times)
    end = next((t for t in reversed(stream.times) if not math.isnan(t)), math.nan)
    first_delta = next(
        (
            t
            for e, t in zip(stream.events, stream.times, strict=True)
            if str(field(e, "type", "")).endswith(".delta") and not math.isnan(t)
        ),
        math.nan,
    )
    generating = end - first_delta
    rate = output_tokens / generating if generating > 0 else math.nan
    return first_delta - start, end - start, rate


def _row(response: Any, stream: CollectedStream | None) -> dict[str, Any]:
    usage = field(response, "usage")
    row: dict[str, Any] = {
        "response_id": field(response, "id"),
        "model": field(response, "model"),
        "status": field(response, "status"),
        "created_at": _dig(response, ("created_at",)),
        "completed_at": _dig(response, ("completed_at",)),
        **{name: _dig(usage, path) for name, path in _TOKENS.items()},
        "streamed": stream is not None,
        "temperature": _dig(response, ("temperature",)),
        "top_p": _dig(response, ("top_p",)),
        "seed": _seed(response),
    }
    timing = _timing(stream, row["output_tokens"]) if stream else (math.nan,) * 3
    row.update(zip(("ttft_s", "duration_s", "tokens_per_s"), timing, strict=True))
    return row


def _seed(response: Any) -> int | None:
    """The sampler's seed: an extra field nbresponses keeps on a Response made with one (vLLM's
    ``seed`` extension); None for others (OpenAI's responses have none)."""
    seed = field(response, "seed")
    return int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None


def _timestamps(seconds: list[float]) -> pd.DatetimeIndex:
    return pd.to_datetime(np.array(seconds, dtype=np.float64), unit="s", utc=True).as_unit("ns")


def usage_frame(
    objs: Any,
    *,
    times: Iterable[float] | None = None,
    lookup: ResponseLookup | None = None,
    choice: int | None = 0,
) -> pd.DataFrame:
    """Token usage per response, plus latency for streams; RangeIndex, one row per response.

    ``objs``: Responses, streams of events, JSON dicts of either, (nested) iterables of them,
    or stored ids read through ``lookup=``, as for :func:`logprobs_frame`. Receive times come
    as ``times=`` (seconds, parallel to a flat iterable of events) or as ``(time, event)``
    pairs. Columns and dtypes are :data:`USAGE_COLUMNS`; counts are NA where a response has no
    usage (e.g. failed).

    Stream timing is measured from the stream's first event: ``ttft_s`` to the first
    ``*.delta`` event of any kind, ``duration_s`` to the last event, and ``tokens_per_s`` is
    ``output_tokens`` over the time from first delta to last event (hidden reasoning tokens
    are counted in ``output_tokens``, which overstates the rate for reasoning models).
    ``temperature`` and ``top_p`` are the response's own; ``seed`` is the sampler's seed of a
    response that was given one (nbresponses and vLLM take ``extra_body={"seed": ...}``;
    nbresponses keeps it on the Response), NA otherwise.

    Chat Completions and legacy Completions answers and streams are read as for
    :func:`logprobs_frame` (``choice`` picks one of ``n > 1``): their ``CompletionUsage`` fills
    the same columns (``prompt_tokens`` -> ``input_tokens``, ``prompt_tokens_details.
    cached_tokens`` -> ``cached_tokens``, ``completion_tokens`` -> ``output_tokens``,
    ``completion_tokens_details.reasoning_tokens`` -> ``reasoning_tokens``; NA where the server
    sent no detail), ``status`` comes from the choice's ``finish_reason`` (``length``:
    incomplete) and ``completed_at`` is NaT (these APIs give only ``created``). The usage of an
    ``n > 1`` answer counts every choice, as the server reports it.
    """
    rows = []
    for entry in collect(objs, None if times is None else list(times), lookup, choice):
        if isinstance(entry, CollectedResponse):
            rows.append(_row(entry.response, None))
        else:
            rows.append(_row(stream_response(entry), entry))
    column = {name: [row[name] for row in rows] for name in USAGE_COLUMNS}
    frame = {
        "response_id": string(column["response_id"]),
        "model": categorical(column["model"]),
        "status": categorical(column["status"]),
        "created_at": _timestamps(column["created_at"]),
        "completed_at": _timestamps(column["completed_at"]),
        **{
            name: nullable_int(np.array(column[name], dtype=np.float64), "Int64")
            for name in _TOKENS
        },
        "streamed": np.array(column["streamed"], dtype=bool),
        **{
            name: np.array(column[name], dtype=np.float64)
            for name in ("ttft_s", "duration_s", "tokens_per_s", "temperature", "top_p")
        },
        "seed": pd.array(column["seed"], dtype="Int64"),  # exact: seeds exceed float64's 2**53
    }
    return pd.DataFrame(frame, copy=False)
