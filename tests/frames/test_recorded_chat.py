"""Frames of recorded Chat Completions and Completions traffic (OpenAI, DeepSeek, OpenRouter,
vLLM), checked against the raw chunks and against the SDK's own fold of each stream."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from helpers.recorded_chat import load
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pandas.testing import assert_frame_equal

import nbresponses as nbr


def sdk_fold(chunks: list[dict[str, Any]]) -> ChatCompletion:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


def raw_entries(chunks: list[dict[str, Any]], key: str = "content") -> list[dict[str, Any]]:
    return [
        entry
        for c in chunks
        for choice in c["choices"]
        if choice.get("logprobs")
        for entry in choice["logprobs"].get(key) or ()
    ]


def test_the_logprobs_stream_gives_its_tokens_and_alternatives() -> None:
    chunks = load("dotnet_logprobs")
    entries = raw_entries(chunks)
    assert len(entries) == 829
    frame = nbr.logprobs_frame(chunks)
    assert list(frame.token) == [e["token"] for e in entries]
    assert np.array_equal(frame.logprob.to_numpy(), [e["logprob"] for e in entries])
    assert list(frame.bytes) == [bytes(e["bytes"]) for e in entries]
    assert "".join(frame.text) == "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    top = nbr.top_logprobs_frame(chunks)
    assert len(top) == 3 * 829 and (top.groupby("position").size() == 3).all()
    first = entries[0]["top_logprobs"]
    assert list(top.token[:3]) == [t["token"] for t in first]
    assert frame.n_top.eq(3).all()
    # the stream reads as the SDK's fold of it, which reads as a non-streamed answer
    folded = sdk_fold(chunks)
    assert_frame_equal(frame, nbr.logprobs_frame(folded))
    assert_frame_equal(top, nbr.top_logprobs_frame(folded))
    assert_frame_equal(nbr.words_frame(chunks), nbr.words_frame(folded))


def test_refusal_logprobs() -> None:
    chunks = load("refusal_logprobs")
    frame = nbr.logprobs_frame(chunks)
    entries = raw_entries(chunks, "refusal")
    assert len(entries) == 11
    assert list(frame.token) == [e["token"] for e in entries]
    assert "".join(frame.text) == "I'm very sorry, but I can't assist with that."


@pytest.mark.parametrize(
    "name",
    [
        "dotnet_logprobs",
        "content_logprobs",
        "refusal_logprobs",
        "one_tool",
        "parallel_tools",
        "n3",
        "deepseek",
        "openrouter",
        "openrouter_error",
        "vllm",
        "legacy_stream",
    ],
)
def test_usage_frame_reads_every_provider_s_usage(name: str) -> None:
    chunks = load(name)
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    times = [float(i) for i in range(len(chunks))]
    row = nbr.usage_frame(chunks, times=times).iloc[0]
    assert row.response_id == chunks[0]["id"] and row.model == chunks[-1]["model"]
    assert row.input_tokens == usage["prompt_tokens"]
    assert row.output_tokens == usage["completion_tokens"]
    assert row.total_tokens == usage["total_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    assert (row.cached_tokens is pd_na()) if cached is None else row.cached_tokens == cached
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    assert (
        (row.reasoning_tokens is pd_na())
        if reasoning is None
        else (row.reasoning_tokens == reasoning)
    )
    assert row.streamed and row.duration_s == len(chunks) - 1
    assert row.created_at.timestamp() == chunks[0]["created"]
    expected = {"openrouter_error": "failed", "legacy_stream": "incomplete"}.get(name, "completed")
    assert row.status == expected


def pd_na() -> Any:
    import pandas as pd

    return pd.NA


def test_n3_and_n2_choices() -> None:
    chunks = load("n3")  # sent without logprobs: the usage, of all three choices, is read
    for k in range(3):
        row = nbr.usage_frame(chunks, choice=k).iloc[0]
        assert (
            row.status == "completed"
            and row.output_tokens == chunks[-1]["usage"]["completion_tokens"]
        )
    with pytest.raises(ValueError, match="choice=3"):
        nbr.usage_frame(chunks, choice=3)
    body = load("n2")
    with pytest.warns(UserWarning, match="no token logprobs"):  # sent with logprobs: null
        assert nbr.logprobs_frame(body, choice=1).empty
    assert nbr.usage_frame(body, choice=1).loc[0, "total_tokens"] == body["usage"]["total_tokens"]


def test_the_deepseek_answer_sits_after_its_reasoning() -> None:
    usage = nbr.usage_frame(load("deepseek"))
    assert usage.loc[0, "reasoning_tokens"] == 34
    events = nbr.events_frame(load("deepseek"))
    kinds = list(events.type)
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    text_rows = events[events.type == "response.output_text.delta"]
    assert text_rows.output_index.eq(1).all()


def test_the_legacy_body_and_stream_without_logprobs() -> None:
    with pytest.warns(UserWarning):
        assert nbr.logprobs_frame(load("legacy")).empty
    usage = nbr.usage_frame([load("legacy"), load("legacy_stream")])
    assert list(usage.streamed) == [False, True] and len(usage) == 2
    assert list(usage.status) == ["incomplete", "incomplete"]
    assert not math.isnan(usage.loc[0, "created_at"].timestamp())


def test_samples_frame_of_the_n3_stream() -> None:
    from collections import Counter

    chunks = load("n3")
    texts = Counter(
        "".join(
            ch["delta"].get("content") or ""
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == k
        )
        for k in range(3)
    )
    samples = nbr.samples_frame(chunks)
    assert samples.attrs["n"] == 3
    assert dict(zip(samples.answer, samples["count"], strict=True)) == dict(texts)
    ids = [i for row in samples.response_ids for i in row]
    assert sorted(ids) == [f"{chunks[0]['id']}#{k}" for k in range(3)]
