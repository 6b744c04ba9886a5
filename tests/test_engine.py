"""nbr.Engine end to end: the real ONNX engine behind the Responses client, views and frames."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.responses import check_stream, fold
from openai.types.responses import Response

import nbresponses as nbr
from nbresponses.engine import Engine


@pytest.fixture
async def tiny_engine(tiny_source, cache_dir):
    engine = await Engine.load(tiny_source, "fp32", cache_dir=cache_dir, progress=False)
    yield engine
    await engine.aclose()


async def test_create_returns_an_openai_response_with_logprobs(tiny_engine) -> None:
    client = tiny_engine.client()
    assert client is tiny_engine.client(), "one client: one store for every caller"
    response = await client.responses.create(
        input="Say something.",
        max_output_tokens=12,
        temperature=0,
        top_logprobs=3,
        include=["message.output_text.logprobs"],
    )
    assert isinstance(response, Response) and response.model == tiny_engine.model
    assert response.status in ("completed", "incomplete")
    assert response.usage.output_tokens >= 1 and response.usage.input_tokens > 10
    frame = nbr.logprobs_frame(response)
    assert len(frame) >= 1 and (frame["logprob"] <= 0).all()
    assert "".join(frame["text"]) == response.output_text  # the tokens rebuild the answer
    assert 1 <= len(frame) <= response.usage.output_tokens
    # the engine is a lookup: the frames read its stored responses by id
    assert tiny_engine.find(response.id) == response and tiny_engine.find("resp_not_here") is None
    pd.testing.assert_frame_equal(nbr.logprobs_frame(response.id, lookup=tiny_engine), frame)


async def test_streamed_and_folded_equal_the_events(tiny_engine) -> None:
    client = tiny_engine.client()
    stream = await client.responses.create(
        input="Count to five.", max_output_tokens=10, temperature=0, stream=True
    )
    events = [event async for event in stream]
    check_stream(events)
    final = events[-1].response
    if final.status == "completed":  # the SDK accumulator only finishes on response.completed
        assert fold(events).output_text == final.output_text
    else:
        assert events[-1].type == "response.incomplete"
        assert final.incomplete_details.reason == "max_output_tokens"
    again = await client.responses.create(
        input="Count to five.", max_output_tokens=10, temperature=0
    )
    assert again.output_text == final.output_text, "greedy fp32: the same answer twice"


async def test_multi_turn_reuses_the_kv_cache(tiny_engine) -> None:
    client = tiny_engine.client()
    first = await client.responses.create(input="Hello there.", max_output_tokens=8, temperature=0)
    second = await client.responses.create(
        input="And again.", previous_response_id=first.id, max_output_tokens=8, temperature=0
    )
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > first.usage.input_tokens // 2, second.usage
    stats = tiny_engine.stats()
    assert stats["source"]["prefix_cache"]["reused_tokens"] >= cached
    assert stats["store"]["responses"] >= 2 and stats["store"]["bytes"] > 0
    assert "prompts hit" in repr(tiny_engine) and "prefix cache" in tiny_engine._repr_html_()
    items = await client.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["And again."]  # this request's input


async def test_the_view_folds_an_engine_stream(tiny_engine) -> None:
    client = tiny_engine.client()
    stream = await client.responses.create(
        input="Hi", max_output_tokens=6, temperature=0, stream=True
    )
    view = nbr.show(stream)
    final = await view
    assert final.output_text == view.response.output_text
    assert final.status in ("completed", "incomplete")


@pytest.mark.integration
async def test_a_restarted_engine_keeps_its_responses(tiny_source, cache_dir, tmp_path) -> None:
    """Close the engine (a kernel restart), load it again on the same file: the stored
    response is equal, its chain continues, the history lists both with the model's hash."""
    path = tmp_path / "responses.sqlite3"
    options = {"cache_dir": cache_dir, "progress": False, "store_path": path}
    engine = await Engine.load(tiny_source, "fp32", **options)
    try:
        first = await engine.client().responses.create(
            input="Hello", max_output_tokens=8, temperature=0, top_logprobs=3,
            include=["message.output_text.logprobs"],
        )  # fmt: skip
    finally:
        await engine.aclose()
    engine = await Engine.load(tiny_source, "fp32", **options)
    try:
        client = engine.client()
        assert await client.responses.retrieve(first.id) == first
        second = await client.responses.create(
            input="Again", previous_response_id=first.id, max_output_tokens=4, temperature=0
        )
        assert second.usage.input_tokens > first.usage.input_tokens  # the first turn is in it
        frame = nbr.history(engine)
        assert list(frame["id"]) == [second.id, first.id]
        assert frame["model_hash"].iloc[0] == engine.prepared.manifest["key"]
        assert frame["recipe"].iloc[0] == "fp32"
    finally:
        await engine.aclose()


@pytest.mark.integration
async def test_bundled_model_answers_sensibly(bundled_model, cache_dir) -> None:
    engine = await Engine.load(bundled_model.path, progress=False)
    try:
        assert bundled_model.recipe in repr(engine) and "top-1" in engine._repr_html_()
        response = await engine.client().responses.create(
            input="Name three primary colors.",
            max_output_tokens=40,
            temperature=0,
            top_logprobs=5,
            include=["message.output_text.logprobs"],
        )
        text = response.output_text.lower()
        assert sum(color in text for color in ("red", "blue", "yellow", "green")) >= 2, text
        frame = nbr.logprobs_frame(response)
        assert "".join(frame["text"]) == response.output_text
        assert 10 < len(frame) <= response.usage.output_tokens
        assert (frame["n_top"] == 5).all()
    finally:
        await engine.aclose()
