"""The openai SDK (async and sync) against our server: in process and over real HTTP."""

from __future__ import annotations

import asyncio

import openai
import pytest
from helpers.responses import EOS, MODEL, ids
from helpers.server import GatedSource, Target, eventually, scripted, tool_call
from openai.types.responses import Response

from nbresponses.service.client import AsyncResponsesClient
from nbresponses.tokens.scripted import Script

KINDS = ["inprocess", "http"]
ANSWER = "The capital of France is Paris."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,  # strict by default, as on OpenAI
    },
}

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kind", KINDS)
async def test_create_async_and_sync(tokenizer, kind):
    client, source = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        r = await target.openai().responses.create(model=MODEL, input="Capital of France?")
        assert isinstance(r, Response) and r.status == "completed"
        assert r.output_text == ANSWER and r.usage.output_tokens == len(ids(tokenizer, ANSWER))
        s = await asyncio.to_thread(
            target.openai(sync=True).responses.create, model=MODEL, input="Capital of France?"
        )
        assert s.output_text == ANSWER and s.id != r.id
        assert (await target.openai().responses.retrieve(s.id)).output_text == ANSWER
    assert len(source.prompts) == 2


def _gated(tokenizer, text: str) -> tuple[AsyncResponsesClient, GatedSource]:
    source = GatedSource([Script(ids(tokenizer, text))], eos_token_ids=(EOS,))
    return AsyncResponsesClient(source, tokenizer, model=MODEL), source


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_events_arrive_as_generated(tokenizer, kind):
    """Each token is released only after the reader saw the previous one's delta: a transport
    that buffered the body would never deliver the first delta."""
    client, source = _gated(tokenizer, "one two three four five six")
    with Target(kind, client) as target:
        source.permit()
        stream = await target.openai().responses.create(model=MODEL, input="count", stream=True)
        types, deltas = [], 0
        async for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas += 1
                assert source.produced == deltas  # this event came while generation waited
                source.permit()
        assert deltas == 6 and types[-1] == "response.completed"
        assert types[:2] == ["response.created", "response.in_progress"]


@pytest.mark.parametrize("kind", KINDS)
def test_sync_stream_events_arrive_as_generated(tokenizer, kind):
    client, source = _gated(tokenizer, "alpha beta gamma delta")
    with Target(kind, client) as target:
        source.permit()
        stream = target.openai(sync=True).responses.create(model=MODEL, input="x", stream=True)
        deltas = 0
        with stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas += 1
                    assert source.produced == deltas
                    source.permit()
        assert deltas == 4 and event.type == "response.completed"


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_helper_accumulates_the_same_response(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        sdk = target.openai()
        async with sdk.responses.stream(model=MODEL, input="Capital?") as stream:
            texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
        assert "".join(texts) == final.output_text == ANSWER
        stored = await sdk.responses.retrieve(final.id)
        assert (stored.id, stored.status, stored.usage) == (final.id, final.status, final.usage)
        assert stored.output_text == final.output_text
        with target.openai(sync=True).responses.stream(model=MODEL, input="Capital?") as sync:
            assert sync.get_final_response().output_text == ANSWER


@pytest.mark.parametrize("kind", KINDS)
async def test_parse_fills_output_parsed(tokenizer, kind):
    """responses.parse(text_format=Model): the SDK sends the pydantic model's strict schema,
    the grammar admits the scripted JSON, and output_parsed is the model instance."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    client, source = scripted(tokenizer, '{"name": "Paris", "population": 2100000}')
    with Target(kind, client) as target:
        parsed = await target.openai().responses.parse(model=MODEL, input="x", text_format=City)
        assert parsed.status == "completed"
        assert parsed.output_parsed == City(name="Paris", population=2100000)
        assert parsed.text.format.type == "json_schema" and parsed.text.format.strict
        assert parsed.text.format.schema_["properties"].keys() == {"name", "population"}
        assert source.params[-1].constraint is not None
        async with target.openai().responses.stream(
            model=MODEL, input="x", text_format=City
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert "response.output_text.delta" in kinds
        assert final.output_parsed == City(name="Paris", population=2100000)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_grammar_refuses_what_the_schema_does_not_allow(tokenizer, kind):
    """The scripted source applies the mask as the engine does: text that is not the schema's
    JSON cannot come out (the run fails instead of returning it)."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str

    client, _ = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        response = await target.openai().responses.create(
            model=MODEL,
            input="x",
            text={
                "format": {
                    "type": "json_schema",
                    "name": "city",
                    "schema": City.model_json_schema() | {"additionalProperties": False},
                    "strict": True,
                }
            },
        )
        assert response.status == "failed" and "grammar" in response.error.message
        assert response.output_text == ""


@pytest.mark.parametrize("kind", KINDS)
async def test_a_schema_feature_that_cannot_be_enforced_is_a_400(tokenizer, kind):
    """With strict: true (without it, best effort: the keyword is left out, not refused)."""
    client, source = scripted(tokenizer, ANSWER)
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    with Target(kind, client) as target:
        with pytest.raises(openai.BadRequestError) as err:
            await target.openai().responses.create(
                model=MODEL,
                input="x",
                text={
                    "format": {"type": "json_schema", "name": "t", "schema": schema, "strict": True}
                },
            )
        assert err.value.status_code == 400 and err.value.param == "text.format.schema"
        assert "$.properties.tags.uniqueItems" in err.value.message and not source.prompts
        parsed = await target.openai().responses.parse(model=MODEL, input="x")  # no schema: fine
        assert parsed.output_text == ANSWER


@pytest.mark.parametrize("kind", KINDS)
async def test_background_then_retrieve_from_starting_after(tokenizer, kind):
    client, _ = scripted(tokenizer, "a b c d e f g h", delay=0.01)
    with Target(kind, client) as target:
        sdk = target.openai()
        bg = await sdk.responses.create(model=MODEL, input="x", background=True)
        assert bg.status in ("queued", "in_progress") and bg.background
        stream = await sdk.responses.retrieve(bg.id, stream=True, starting_after=3)
        events = [e async for e in stream]
        assert events[0].sequence_number == 4
        numbers = [e.sequence_number for e in events]
        assert numbers == list(range(4, 4 + len(events)))
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "a b c d e f g h"
        # the sync client follows the same stored run from the start
        replay = list(target.openai(sync=True).responses.retrieve(bg.id, stream=True))
        assert [e.sequence_number for e in replay] == list(range(len(replay)))
        assert replay[-1].model_dump() == events[-1].model_dump()


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_a_background_response(tokenizer, kind):
    client, source = scripted(tokenizer, " ".join(["word"] * 300), delay=0.02)
    with Target(kind, client) as target:
        sdk = target.openai()
        bg = await sdk.responses.create(model=MODEL, input="x", background=True)
        await eventually(lambda: len(source.prompts) == 1)
        cancelled = await sdk.responses.cancel(bg.id)
        assert cancelled.status == "cancelled"
        assert (await sdk.responses.retrieve(bg.id)).status == "cancelled"
        assert source.cancelled == 1
        again = await asyncio.to_thread(target.openai(sync=True).responses.cancel, bg.id)
        assert again.status == "cancelled"  # idempotent


@pytest.mark.parametrize("kind", KINDS)
async def test_closing_a_stream_cancels_its_generation(tokenizer, kind):
    client, source = scripted(tokenizer, " ".join(["word"] * 300), delay=0.02)
    with Target(kind, client) as target:
        sdk = target.openai()
        stream = await sdk.responses.create(model=MODEL, input="x", stream=True)
        seen = []
        async for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        await eventually(lambda: source.cancelled == 1)
        rid = seen[0].response.id
        stored = await sdk.responses.retrieve(rid)
        assert stored.status == "cancelled" and stored.output_text.startswith("word")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_caller_that_gives_up_cancels_a_plain_create(tokenizer, kind):
    client, source = scripted(tokenizer, " ".join(["word"] * 300), delay=0.02)
    with Target(kind, client) as target:
        with pytest.raises(openai.APITimeoutError):
            await target.openai(timeout=0.3).responses.create(model=MODEL, input="x")
        await eventually(lambda: source.cancelled == 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_tool_round_trip(tokenizer, kind):
    client, source = scripted(
        tokenizer, tool_call("get_weather", {"city": "Oslo"}), "It is sunny in Oslo."
    )
    with Target(kind, client) as target:
        sdk = target.openai()
        first = await sdk.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER])
        call = first.output[-1]
        assert call.type == "function_call" and call.name == "get_weather"
        assert call.arguments == '{"city": "Oslo"}'
        second = await sdk.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=[WEATHER],
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}
            ],
        )
        assert second.output_text == "It is sunny in Oslo."
        prompt = tokenizer.decode(source.prompts[-1])
        assert "sunny, 21C" in prompt and "get_weather" in prompt


@pytest.mark.parametrize("kind", KINDS)
async def test_logprobs_cross_the_wire(tokenizer, kind):
    client, _ = scripted(tokenizer, Script(ids(tokenizer, "Paris is lovely"), logprobs=[-0.5] * 9))
    with Target(kind, client) as target:
        r = await target.openai().responses.create(
            model=MODEL, input="x", include=["message.output_text.logprobs"], top_logprobs=3
        )
        part = r.output[0].content[0]
        assert part.text == "Paris is lovely"
        assert b"".join(bytes(lp.bytes) for lp in part.logprobs).decode() == part.text
        assert all(lp.logprob == -0.5 and len(lp.top_logprobs) == 3 for lp in part.logprobs)


@pytest.mark.parametrize("kind", KINDS)
async def test_input_items_delete_and_not_found(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        sdk = target.openai()
        r = await sdk.responses.create(model=MODEL, input="Capital of France?")
        items = await sdk.responses.input_items.list(r.id)
        assert [i.content[0].text for i in items.data] == ["Capital of France?"]
        assert items.first_id == items.data[0].id and not items.has_more
        assert await sdk.responses.delete(r.id) is None
        for call in (sdk.responses.retrieve, sdk.responses.delete, sdk.responses.cancel):
            with pytest.raises(openai.NotFoundError) as err:
                await call(r.id)
            assert err.value.body["param"] == "response_id"
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.input_items.list(r.id)
        with pytest.raises(openai.NotFoundError) as err:
            await sdk.responses.create(model="gpt-5", input="x")
        assert err.value.code == "model_not_found"
        models = await sdk.models.list()
        assert [m.id for m in models.data] == [MODEL]
        assert (await sdk.models.retrieve(MODEL)).id == MODEL


async def test_sync_and_async_in_process_clients_share_runs(tokenizer):
    """A background run made by the sync client (its own loop thread) is followed, cancelled
    and deleted from the async client on this loop, and the other way round."""
    from nbresponses.server.inprocess import InProcessServer

    client, source = scripted(tokenizer, " ".join(["word"] * 40), delay=0.01)
    server = InProcessServer(client)
    sync, aio = server.openai(sync=True), server.openai()
    bg = await asyncio.to_thread(sync.responses.create, model=MODEL, input="x", background=True)
    events = [e async for e in await aio.responses.retrieve(bg.id, stream=True)]
    assert events[-1].type == "response.completed" and events[0].sequence_number == 0
    slow = await asyncio.to_thread(sync.responses.create, model=MODEL, input="y", background=True)
    assert (await aio.responses.cancel(slow.id)).status == "cancelled"
    await aio.responses.delete(bg.id)
    mine = await aio.responses.create(model=MODEL, input="z", background=True)
    followed = await asyncio.to_thread(lambda: list(sync.responses.retrieve(mine.id, stream=True)))
    assert followed[-1].type == "response.completed"
    assert source.cancelled == 1


async def test_sync_call_on_the_loop_it_blocks_is_a_clean_400(tokenizer):
    """A notebook cell calling the sync client while this loop generates the run it asks for
    would deadlock; it gets a 400 naming the way out instead."""
    from nbresponses.server.inprocess import InProcessServer

    client, _ = scripted(tokenizer, " ".join(["word"] * 200), delay=0.02)
    server = InProcessServer(client)
    aio, sync = server.openai(), server.openai(sync=True)
    bg = await aio.responses.create(model=MODEL, input="x", background=True)
    with pytest.raises(openai.BadRequestError) as err:
        list(sync.responses.retrieve(bg.id, stream=True))  # called on this loop's thread
    assert err.value.code == "blocked_event_loop"
    assert sync.responses.retrieve(bg.id).id == bg.id  # a snapshot is fine: nothing runs
    await aio.responses.cancel(bg.id)
    assert sync.responses.retrieve(bg.id).status == "cancelled"
