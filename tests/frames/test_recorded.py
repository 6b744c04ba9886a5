"""Frames on real recorded OpenAI traffic (shared/fixtures/recorded)."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from helpers.recorded import iter_recorded_responses, iter_recorded_streams

from nbresponses.frames import (
    EVENTS_COLUMNS,
    LOGPROBS_COLUMNS,
    USAGE_COLUMNS,
    events_frame,
    logprobs_frame,
    perplexity,
    top_logprobs_frame,
    usage_frame,
)

STREAMS = dict(iter_recorded_streams())
RESPONSES = dict(iter_recorded_responses())
LOGPROBS_CASSETTE = "pydantic-ai__test_openai_instructions_with_responses_logprobs.yaml"


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(*args)


def _dtypes(frame: pd.DataFrame) -> dict[str, str]:
    return {name: str(dtype) for name, dtype in frame.dtypes.items()}


def test_loader_finds_both_formats() -> None:
    assert len(STREAMS) >= 10 and len(RESPONSES) >= 6
    assert all(events and "type" in events[0] for events in STREAMS.values())
    assert all(r["object"] == "response" for r in RESPONSES.values())


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_every_stream_converts(name: str) -> None:
    events = STREAMS[name]
    frame = _quiet(logprobs_frame, events)
    assert _dtypes(frame) == LOGPROBS_COLUMNS
    _quiet(top_logprobs_frame, events)
    timeline = events_frame(events)
    assert _dtypes(timeline) == EVENTS_COLUMNS
    assert len(timeline) == len(events)
    assert timeline["type"].tolist() == [e["type"] for e in events]
    usage = usage_frame(events)
    assert _dtypes(usage) == USAGE_COLUMNS
    assert len(usage) == timeline["stream"].nunique()


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_frame_equals_terminal_response_frame(name: str) -> None:
    events = STREAMS[name]
    finals = [
        e["response"] for e in events if e["type"] in ("response.completed", "response.failed")
    ]
    pd.testing.assert_frame_equal(_quiet(logprobs_frame, events), _quiet(logprobs_frame, finals))
    streamed = usage_frame(events)
    folded = usage_frame(finals)
    cols = ["response_id", "model", "status", "input_tokens", "output_tokens", "total_tokens"]
    pd.testing.assert_frame_equal(streamed[cols], folded[cols], check_categorical=False)


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_every_response_converts(name: str) -> None:
    response = RESPONSES[name]
    frame = _quiet(logprobs_frame, response)
    assert _dtypes(frame) == LOGPROBS_COLUMNS
    usage = usage_frame(response)
    assert len(usage) == 1
    row = usage.iloc[0]
    assert row["response_id"] == response["id"] and row["model"] == response["model"]
    assert row["created_at"] == pd.Timestamp(response["created_at"], unit="s", tz="UTC")
    if response.get("usage"):
        assert row["input_tokens"] == response["usage"]["input_tokens"]
        assert row["output_tokens"] == response["usage"]["output_tokens"]
        assert row["total_tokens"] == response["usage"]["total_tokens"]


def test_logprob_cassette_round_trips_exactly() -> None:
    response = RESPONSES[LOGPROBS_CASSETTE]
    part = response["output"][0]["content"][0]
    frame = logprobs_frame(response)
    assert frame["token"].tolist() == [e["token"] for e in part["logprobs"]]
    assert frame["logprob"].tolist() == [e["logprob"] for e in part["logprobs"]]
    assert frame["bytes"].tolist() == [bytes(e["bytes"]) for e in part["logprobs"]]
    assert "".join(frame["text"]) == part["text"]
    assert frame["response_id"].unique().tolist() == [response["id"]]
    assert frame["item_id"].unique().tolist() == [response["output"][0]["id"]]
    assert frame["n_top"].eq(0).all()  # the recording asked for no alternatives
    ppl = perplexity(response)
    assert ppl.loc[response["id"], "n_tokens"] == 9
    assert ppl.loc[response["id"], "sequence_logprob"] == pytest.approx(-0.000097)


def test_recorded_text_without_logprobs_warns_with_the_fix() -> None:
    with pytest.warns(UserWarning, match="message.output_text.logprobs"):
        logprobs_frame(STREAMS["pydantic-ai__test_openai_responses_stream.yaml#1"])


def test_concatenated_recording_splits_into_streams() -> None:
    events = STREAMS["vercel-ai__openai-reasoning-encrypted-content.1.chunks.txt"]
    usage = usage_frame(events)
    starts = sum(e["type"] == "response.created" for e in events)
    assert starts == 4 and len(usage) == 4
    assert usage["response_id"].is_unique
    assert events_frame(events)["stream"].nunique() == 4


def test_failed_stream_has_missing_usage() -> None:
    usage = usage_frame(STREAMS["vercel-ai__openai-error.1.chunks.txt"])
    assert usage["status"].tolist() == ["failed"]
    assert usage["input_tokens"].isna().all()
