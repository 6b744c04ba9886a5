"""The Responses protocol over a scripted token source and the real SmolLM2 tokenizer."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import openai
import pytest
from helpers.responses import (
    CALL,
    WEATHER,
    check_stream,
    client_for,
    dumps,
    fold,
    ids,
    prompt_text,
    stream_events,
    strip_ids,
)
from openai.types.responses import Response

from nbresponses.tokens.scripted import Script

# -- text, folding, logprobs ---------------------------------------------------------------


async def test_stream_folds_to_the_non_streamed_response(tokenizer):
    client, _ = client_for(tokenizer, "The capital of France is Paris. 🙂")
    events = await stream_events(client, input="Capital of France?")
    check_stream(events)
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    folded = fold(events)
    completed = events[-1].response
    assert folded.id == completed.id and folded.id.startswith("resp_")
    assert dumps(folded.output) == dumps(completed.output) and folded.usage == completed.usage
    assert folded.output_text == "The capital of France is Paris. 🙂"
    stored = await client.responses.retrieve(completed.id)
    assert stored == completed
    plain = await client.responses.create(input="Capital of France?")
    assert isinstance(plain, Response) and plain.status == "completed"
    assert strip_ids(plain.model_dump()) == strip_ids(completed.model_dump())
    assert plain.output[0].id.startswith("msg_")


async def test_logprobs_each_token_with_alternatives(tokenizer):
    text = "Zürich 日本 ok"
    script = Script(ids(tokenizer, text), logprobs=[-0.5] * 20)
    client, source = client_for(tokenizer, script)
    events = await stream_events(
        client, input="hi", include=["message.output_text.logprobs"], top_logprobs=4
    )
    check_stream(events)
    assert source.params[-1].logprobs and source.params[-1].top_logprobs == 4
    part = events[-1].response.output[0].content[0]
    assert part.text == text
    assert len(part.logprobs) == len(tokenizer.encode(text))
    assert b"".join(bytes(lp.bytes) for lp in part.logprobs).decode() == text
    for lp in part.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 4
        assert all(t.logprob <= 0 for t in lp.top_logprobs)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all("\ufffd" not in d.delta for d in deltas)
    joined = [lp.token for d in deltas for lp in d.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert joined == [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]


async def test_no_logprobs_unless_asked(tokenizer):
    client, source = client_for(tokenizer, "Hello there")
    r = await client.responses.create(input="hi")
    assert not source.params[-1].logprobs
    assert r.output[0].content[0].logprobs == []


async def test_a_slow_reader_gets_every_event(tokenizer):
    """The run finishes (and the store drops its event log) long before a reader that
    pauses between events is through: the reader still gets all of them."""
    client, _ = client_for(tokenizer, "Hello there, friend, how are you today?")
    fast = await stream_events(client, input="hi")
    stream = await client.responses.create(input="hi", stream=True)
    slow = []
    async for event in stream:
        slow.append(event)
        await asyncio.sleep(0.005)
    assert [e.type for e in slow] == [e.type for e in fast]
    assert slow[-1].type == "response.completed"
    late = await client.responses.create(input="hi", stream=True)
    await client.store.get(late.response_id).run.wait()  # done before the first read
    assert [e.type async for e in late] == [e.type for e in fast]


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param", "cls"),
    [
        ({"service_tier": "flex"}, "service_tier", openai.BadRequestError),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate", openai.BadRequestError),
        ({"top_logprobs": 21}, "top_logprobs", openai.BadRequestError),
        ({"temperature": 3}, "temperature", openai.BadRequestError),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]", openai.BadRequestError),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", openai.BadRequestError),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", openai.BadRequestError),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"not": {}},
                        "strict": True,
                    }
                }
            },
            "text.format.schema",
            openai.BadRequestError,
        ),
        (
            {
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {}, "strict": True}
                }
            },
            "text.format.schema",
            openai.BadRequestError,
        ),
        ({"model": "gpt-9"}, "model", openai.NotFoundError),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
            openai.BadRequestError,
        ),
        ({"background": True, "store": False}, "store", openai.BadRequestError),
        ({"previous_response_id": "resp_nope"}, "previous_response_id", openai.BadRequestError),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
            openai.BadRequestError,
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_a", "output": "1"},
                    {"type": "function_call_output", "call_id": "call_b", "output": "2"},
                ]
            },
            "input[3].call_id",
            openai.BadRequestError,
        ),
    ],
)
async def test_errors_are_openai_exceptions(tokenizer, kwargs, param, cls):
    client, source = client_for(tokenizer, "x")
    kwargs = {"input": "hi", **kwargs}
    with pytest.raises(cls) as err:
        await client.responses.create(**kwargs)
    assert err.value.param == param and err.value.type == "invalid_request_error"
    assert err.value.status_code == (404 if cls is openai.NotFoundError else 400)
    assert err.value.response.json()["error"]["param"] == param
    assert source.prompts == []  # nothing reached the engine


async def test_context_length_exceeded(tokenizer):
    client, _ = client_for(tokenizer, "x", context_length=10)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="hello " * 20)
    assert err.value.code == "context_length_exceeded"


async def test_engine_failure_fails_only_that_response(tokenizer):
    failing = Script(
        ids(tokenizer, "Partial answer that"), error="boom", error_after=3, delay=0.001
    )
    raising = Script(ids(tokenizer, "abc"), error="kaput", raise_error=True)
    client, _ = client_for(tokenizer, failing, raising, "Fine.")
    stream = await client.responses.create(input="a", stream=True)
    other = asyncio.create_task(client.responses.create(input="b"))
    raised = await client.responses.create(input="c")
    events = [e async for e in stream]
    check_stream(events)
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert failed.error.message == "boom" and failed.output[0].status == "incomplete"
    assert raised.status == "failed" and "kaput" in raised.error.message
    assert (await other).output_text == "Fine."  # scripts go out in call order: a, c, b
    ok = await client.responses.create(input="d")
    assert ok.status == "completed" and ok.output_text == "Fine."


# -- store, chains ------------------------------------------------------------------------


async def test_store_false_and_bounds(tokenizer):
    client, _ = client_for(tokenizer, "a", store_max_responses=2)
    r = await client.responses.create(input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(r.id)
    ids_ = [(await client.responses.create(input="x")).id for _ in range(3)]
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(ids_[0])  # least recently used went first
    assert (await client.responses.retrieve(ids_[2])).id == ids_[2]
    small, _ = client_for(tokenizer, "a", store_max_bytes=1)
    last = await small.responses.create(input="x")
    assert len(small.store) == 0 and small.store.bytes == 0
    with pytest.raises(openai.NotFoundError):
        await small.responses.retrieve(last.id)


@pytest.mark.slow
async def test_store_counts_what_a_chain_holds(tokenizer):
    """A chain's records share their items: each is counted once, and what the store counts is
    what tracemalloc sees held (it once counted a 25-turn chain at 1/44 of that)."""
    answer = "A fairly long answer about many things. " * 30
    client, source = client_for(tokenizer, "warm", *[answer] * 25, context_length=100_000)
    await client.responses.create(input="warm-up", store=False)  # first-call caches
    gc.collect()
    tracemalloc.start()
    try:
        prev = None
        for i in range(25):
            r = await client.responses.create(input=f"Q{i} " * 50, previous_response_id=prev)
            prev = r.id
        source.prompts.clear()  # the test double's own record of prompts
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0.75 < held / client.store.bytes < 1.25
    for record_id in client.store:
        await client.responses.delete(record_id)
    assert client.store.bytes == 0 and len(client.store) == 0


async def test_store_bound_holds_for_a_long_chain(tokenizer):
    """Ancestors go first and their children keep the chain; once the chain alone outgrows the
    bound it is evicted too, and continuing it is a clear 400 (it once held gigabytes)."""
    answer = "Another long answer. " * 40
    client, source = client_for(tokenizer, *[answer] * 40, context_length=100_000)
    probe, _ = client_for(tokenizer, answer, context_length=100_000)
    await probe.responses.create(input="Q " * 50)
    bound = 8 * probe.store.bytes  # a few turns, not forty
    client.store.max_bytes = bound
    prev, first, turns, orphans = None, None, 0, 0
    with pytest.raises(openai.BadRequestError) as err:
        for i in range(40):
            r = await client.responses.create(input=f"Q{i} " * 50, previous_response_id=prev)
            first, prev, turns = first or r.id, r.id, turns + 1
            assert client.store.bytes <= bound
            if first not in client.store:  # an ancestor went: its items live on in the child
                assert "Q0 Q0" in prompt_text(tokenizer, source)
                orphans += 1
    assert err.value.code == "previous_response_not_found" and orphans and turns < 40


async def test_delete_and_input_items(tokenizer):
    client, _ = client_for(tokenizer, "a")
    items = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Dev."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "reasoning", "id": "rs_given", "summary": [], "status": "completed"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    ]
    r = await client.responses.create(input=items, instructions="Sys.")
    page = await client.responses.input_items.list(r.id, order="asc")
    assert [i.type for i in page.data] == [i.get("type", "message") for i in items]
    assert page.data[5].id == "rs_given" and all(i.id for i in page.data)
    desc = await client.responses.input_items.list(r.id, limit=3)
    assert [i.id for i in desc.data] == [i.id for i in page.data[::-1][:3]] and desc.has_more
    await client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(r.id)


async def test_previous_response_chain_with_tools_and_branches(tokenizer):
    client, source = client_for(tokenizer, CALL, "It is sunny.", "Left.", "Right.")
    first = await client.responses.create(input="Weather?", tools=[WEATHER])
    call = first.output[0]
    second = await client.responses.create(
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        previous_response_id=first.id,
        tools=[WEATHER],
    )
    p = prompt_text(tokenizer, source)
    assert "Weather?" in p and '"city": "Zürich"' in p and "<tool_response>\nsunny" in p
    left = await client.responses.create(input="Go left", previous_response_id=second.id)
    right = await client.responses.create(input="Go right", previous_response_id=second.id)
    p_left, p_right = prompt_text(tokenizer, source, -2), prompt_text(tokenizer, source, -1)
    assert "It is sunny." in p_left and "It is sunny." in p_right
    assert "Go left" in p_left and "Go left" not in p_right and "Left." not in p_right
    assert left.previous_response_id == right.previous_response_id == second.id
    await client.responses.delete(first.id)  # ancestors may go; the chain survives
    await client.responses.create(input="more", previous_response_id=left.id)
    assert "Weather?" in prompt_text(tokenizer, source)


# -- background, cancel ---------------------------------------------------------------------


async def test_background_replay_after_n_then_live(tokenizer):
    script = Script(ids(tokenizer, "one two three four five six seven"), delay=0.02)
    client, _ = client_for(tokenizer, script)
    queued = await client.responses.create(input="count", background=True)
    assert queued.status == "queued" and queued.background
    first = await client.responses.retrieve(queued.id, stream=True)
    seen = []
    async for e in first:
        seen.append(e)
        if len(seen) == 8:
            break
    await first.close()
    assert [e.type for e in seen[:3]] == [
        "response.created", "response.queued", "response.in_progress"
    ]  # fmt: skip
    rest = await client.responses.retrieve(queued.id, stream=True, starting_after=5)
    tail = [e async for e in rest]
    assert tail[0].sequence_number == 6 and tail[:2] == seen[6:8]
    everything = seen[:6] + tail
    check_stream(everything)
    assert everything[-1].type == "response.completed"
    assert fold(everything).output_text == "one two three four five six seven"
    done = await client.responses.retrieve(queued.id)
    assert done.status == "completed"


async def test_replay_past_the_end_is_an_error(tokenizer):
    client, _ = client_for(tokenizer, "one two")
    done = await client.responses.create(input="x", background=True)
    while (await client.responses.retrieve(done.id)).status != "completed":
        await asyncio.sleep(0.01)
    events = [e async for e in await client.responses.retrieve(done.id, stream=True)]
    last = events[-1].sequence_number
    tail = await client.responses.retrieve(done.id, stream=True, starting_after=last)
    assert [e async for e in tail] == []  # nothing after the last one: fine
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.retrieve(done.id, stream=True, starting_after=last + 1)
    assert err.value.param == "starting_after" and f"sequence number {last}" in err.value.message


async def test_cancel_background_keeps_partial_output(tokenizer):
    script = Script(ids(tokenizer, "word " * 200), delay=0.005)
    client, source = client_for(tokenizer, script)
    r = await client.responses.create(input="go", background=True)
    stream = await client.responses.retrieve(r.id, stream=True)
    async for e in stream:
        if e.type == "response.output_text.delta" and e.sequence_number > 10:
            break
    cancelled = await client.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and cancelled.output[0].status == "incomplete"
    assert cancelled.output_text.startswith("word word")
    assert source.cancelled == 1
    again = await client.responses.cancel(r.id)
    assert again.status == "cancelled" and again.output == cancelled.output
    rest = [e async for e in stream]
    check_stream([e async for e in await client.responses.retrieve(r.id, stream=True)])
    assert all(e.type != "response.completed" for e in rest)


async def test_cancel_synchronous_is_an_error(tokenizer):
    client, _ = client_for(tokenizer, "done")
    r = await client.responses.create(input="x")
    with pytest.raises(openai.BadRequestError):
        await client.responses.cancel(r.id)


async def test_closing_a_stream_stops_generation(tokenizer):
    client, source = client_for(tokenizer, Script(ids(tokenizer, "la " * 100), delay=0.002))
    stream = await client.responses.create(input="sing", stream=True)
    async with stream:
        async for e in stream:
            if e.type == "response.output_text.delta":
                break
    assert source.cancelled == 1
    stored = await client.responses.retrieve(stream.response_id)
    assert stored.status == "cancelled"


@pytest.mark.timeout(30)
async def test_closing_a_stream_at_its_first_event_ends_the_response(tokenizer):
    """``response.created`` arrives before the generation task took its first step; closing
    there cancels a task that never ran, and the response still settles (it used to hang)."""
    client, source = client_for(tokenizer, Script(ids(tokenizer, "la " * 100), delay=0.002))
    stream = await client.responses.create(input="sing", stream=True)
    async with stream:
        async for e in stream:
            assert e.type == "response.created"
            break
    stored = await client.responses.retrieve(stream.response_id)
    assert stored.status == "cancelled" and stored.output == []
    assert stored.usage is not None and stored.usage.output_tokens == 0
    assert stored.usage.input_tokens > 0
    assert source.prompts == []  # the engine was never asked


async def test_cached_tokens_reported(tokenizer):
    client, _ = client_for(tokenizer, Script(ids(tokenizer, "ok"), cached_tokens=7))
    r = await client.responses.create(input="x")
    assert r.usage.input_tokens_details.cached_tokens == 7
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
