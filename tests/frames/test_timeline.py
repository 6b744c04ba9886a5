"""events_frame and usage_frame: timelines, receive times and stream latency."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.frames import logprob, message, response, stream, tool_call

from nbresponses.frames import USAGE_COLUMNS, events_frame, usage_frame


def _final() -> object:
    entries = [logprob("Hel", -0.1), logprob("lo", -0.2), logprob("!", -0.3)]
    return response(message([entries]), tool_call())


def test_timeline_columns_from_a_typed_stream() -> None:
    events = stream(_final(), per_delta=1)
    ev = events_frame(events)
    assert len(ev) == len(events)
    assert ev["sequence_number"].tolist() == list(range(len(events)))
    deltas = ev[ev["type"] == "response.output_text.delta"]
    assert deltas["delta_len"].tolist() == [3, 2, 1]
    assert deltas["n_logprobs"].tolist() == [1, 1, 1]
    assert deltas["item_id"].tolist() == ["msg_1"] * 3
    assert deltas["output_index"].tolist() == [0, 0, 0]
    added = ev[ev["type"] == "response.output_item.added"]
    assert added["item_id"].tolist() == ["msg_1", "fc_call_1"]  # from the item itself
    assert ev["response_id"].eq("resp_1").all()
    assert ev["time"].isna().all() and ev["delta_len"].isna().sum() == len(ev) - 3


def test_receive_times_and_inter_token_latency_one_liner() -> None:
    events = stream(_final(), per_delta=1)
    times = [100.0 + 0.5 * i for i in range(len(events))]
    ev = events_frame(events, times=times)
    itl = ev[ev.type == "response.output_text.delta"].groupby("stream").time.diff()
    assert itl.dropna().tolist() == [0.5, 0.5]
    assert ev["elapsed"].tolist() == [0.5 * i for i in range(len(events))]
    pairs = events_frame(list(zip(times, events, strict=True)))
    pd.testing.assert_frame_equal(pairs, ev)


def test_times_must_match_events() -> None:
    with pytest.raises(ValueError, match="times="):
        events_frame(stream(_final()), times=[1.0])


def test_usage_from_response_and_from_timed_stream() -> None:
    final = _final()
    events = stream(final, per_delta=1)
    # created at t=10, first delta at t=10.8, last event at t=12
    times = np.linspace(10.0, 12.0, len(events)).tolist()
    first_delta = next(i for i, e in enumerate(events) if e.type.endswith(".delta"))
    u = usage_frame([final, events], times=None)
    assert {k: str(v) for k, v in u.dtypes.items()} == USAGE_COLUMNS
    assert u["streamed"].tolist() == [False, True]
    assert u["input_tokens"].tolist() == [10, 10]
    assert u["cached_tokens"].tolist() == [2, 2]
    assert u["reasoning_tokens"].tolist() == [1, 1]
    assert u["total_tokens"].tolist() == [15, 15]
    assert u["created_at"].tolist() == [pd.Timestamp(1_700_000_000, unit="s", tz="UTC")] * 2
    assert u[["ttft_s", "duration_s", "tokens_per_s"]].isna().all(axis=None)

    timed = usage_frame(events, times=times).iloc[0]
    assert timed["ttft_s"] == pytest.approx(times[first_delta] - 10.0)
    assert timed["duration_s"] == pytest.approx(2.0)
    assert timed["tokens_per_s"] == pytest.approx(5 / (12.0 - times[first_delta]))


def test_usage_of_a_stream_without_terminal_event_is_partial() -> None:
    events = stream(_final(), completed=False)
    u = usage_frame(events, times=[float(i) for i in range(len(events))])
    assert u["status"].tolist() == ["in_progress"]
    assert u["output_tokens"].isna().all() and math.isnan(u["tokens_per_s"].iloc[0])
    assert u["duration_s"].tolist() == [len(events) - 1.0]


def test_usage_of_nothing_is_an_empty_frame_with_schema() -> None:
    u = usage_frame([])
    assert u.empty and {k: str(v) for k, v in u.dtypes.items()} == USAGE_COLUMNS
