"""``/v1/chat/completions`` with the openai SDK, in process and over HTTP, on a scripted model
(the real SmolLM2 tokenizer): the objects and chunks OpenAI sends, requests shaped as the
clients in DESIGN.md 3d send them, and errors as OpenAI-shaped 4xx, never a 500."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
from helpers.responses import MODEL, client_for, ids
from helpers.server import Target, scripted, tool_call
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from nbresponses.tokens.scripted import Script

pytestmark = pytest.mark.timeout(120)
KINDS = ["inprocess", "http"]
USER = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "Paris is the capital of France."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
LANGCHAIN_TOOL = {  # bind_tools: neither strict nor additionalProperties
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip


async def collect(stream) -> list[ChatCompletionChunk]:
    return [chunk async for chunk in stream]


def folded(chunks: list[ChatCompletionChunk], **kwargs) -> ChatCompletion:
    """The SDK's own accumulator over the chunks (what ``chat.completions.stream`` returns)."""
    state = ChatCompletionStreamState(**kwargs)
    for chunk in chunks:
        state.handle_chunk(chunk)
    return state.get_final_completion()


@pytest.mark.parametrize("kind", KINDS)
async def test_an_answer_with_logprobs_and_usage(tokenizer, kind):
    client, source = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        done = await target.openai().chat.completions.create(
            model=MODEL, messages=USER, logprobs=True, top_logprobs=2, max_completion_tokens=50
        )
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    (choice,) = done.choices
    assert choice.message.role == "assistant" and choice.message.content == ANSWER
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    tokens = choice.logprobs.content
    assert "".join(t.token for t in tokens) == ANSWER  # every shown token, the end of turn not
    assert all(bytes(t.bytes).decode() == t.token and len(t.top_logprobs) == 2 for t in tokens)
    assert done.usage.prompt_tokens == len(source.prompts[0])
    assert done.usage.completion_tokens == len(ids(tokenizer, ANSWER))  # with the end of turn
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_is_chunks_as_openai_sends_them(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER, ANSWER)
    request = {"model": MODEL, "messages": USER, "logprobs": True, "top_logprobs": 1}
    with Target(kind, client) as target:
        sdk = target.openai()
        whole = await sdk.chat.completions.create(**request)
        chunks = await collect(
            await sdk.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}
            )
        )
    first, *middle, last_choice, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.id == first.id for c in chunks)
    assert all(c.choices[0].finish_reason is None for c in [first, *middle])
    assert last_choice.choices[0].finish_reason == "stop"
    assert usage.choices == [] and usage.usage == whole.usage
    again = folded(chunks)
    assert again.choices[0].message.content == whole.choices[0].message.content == ANSWER
    assert again.choices[0].logprobs == whole.choices[0].logprobs  # token for token


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool", [WEATHER, LANGCHAIN_TOOL])
async def test_a_tool_call_streamed_and_not(tokenizer, kind, tool):
    client, _ = scripted(tokenizer, *[tool_call("get_weather", {"city": "Oslo"})] * 2)
    request = {"model": MODEL, "messages": USER, "tools": [tool]}
    with Target(kind, client) as target:
        sdk = target.openai()
        whole = await sdk.chat.completions.create(**request)
        chunks = await collect(await sdk.chat.completions.create(**request, stream=True))
    (choice,) = whole.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    head, *rest = deltas
    assert (head.index, head.type, head.function.name) == (0, "function", "get_weather")
    assert head.id.startswith("call_") and head.function.arguments == ""
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    assert "".join(d.function.arguments for d in rest) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert folded(chunks).choices[0].message.tool_calls[0].function.arguments == (
        call.function.arguments
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_loop_as_agents_send_it(tokenizer, kind):
    """The assistant turn comes back with ``content: null`` and ``tool_calls``, the result as a
    plain string, and (as pydantic-ai retries) a second system message after it."""
    client, source = scripted(tokenizer, "It is sunny in Oslo.")
    messages = [
        {"role": "system", "content": "Use the tools."},
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_7", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21C"},
        {"role": "system", "content": "Answer in one sentence."},
    ]  # fmt: skip
    with Target(kind, client) as target:
        done = await target.openai().chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=40
        )
    assert done.choices[0].message.content == "It is sunny in Oslo."
    prompt = tokenizer.decode(source.prompts[0])
    for text in ("Use the tools.", "sunny, 21C", '"city": "Oslo"', "Answer in one sentence."):
        assert text in prompt
    assert prompt.index("sunny, 21C") < prompt.index("Answer in one sentence.")


@pytest.mark.parametrize("kind", KINDS)
async def test_stop_strings_any_number_cut_the_content(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER, ANSWER)
    stops = ["zz", "yy", "xx", "ww", " capital"]  # five: lm-eval's four plus end-of-text
    with Target(kind, client) as target:
        sdk = target.openai()
        done = await sdk.chat.completions.create(
            model=MODEL, messages=USER, stop=stops, logprobs=True
        )
        chunks = await collect(
            await sdk.chat.completions.create(model=MODEL, messages=USER, stop=stops, stream=True)
        )
    assert done.choices[0].message.content == "Paris is the"
    assert done.choices[0].finish_reason == "stop"
    assert "".join(t.token for t in done.choices[0].logprobs.content) == "Paris is the"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Paris is the"
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_budget_ends_with_length(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        done = await target.openai().chat.completions.create(
            model=MODEL, messages=USER, max_tokens=3
        )
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 3
    assert done.choices[0].message.content == tokenizer.decode(ids(tokenizer, ANSWER)[:3])


async def test_a_cut_tool_call_is_never_returned_with_broken_arguments(tokenizer):
    client, _ = scripted(tokenizer, tool_call("get_weather", {"city": "Oslo"}))
    with Target("inprocess", client) as target:
        done = await target.openai().chat.completions.create(
            model=MODEL, messages=USER, tools=[LANGCHAIN_TOOL], max_tokens=12
        )
    (choice,) = done.choices
    assert choice.finish_reason == "length"
    for call in choice.message.tool_calls or []:
        json.loads(call.function.arguments)


@pytest.mark.parametrize("kind", KINDS)
async def test_n_choices_each_with_its_own_run(tokenizer, kind):
    texts = ["One.", "Two words.", "Three words here."]
    client, source = scripted(tokenizer, *texts)
    with Target(kind, client) as target:
        done = await target.openai().chat.completions.create(
            model=MODEL, messages=USER, n=3, seed=5
        )
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert sorted(c.message.content for c in done.choices) == sorted(texts)
    assert len(source.prompts) == 3 and source.prompts[0] == source.prompts[1]
    seeds = [p.seed for p in source.params]
    from nbresponses.runtime.sampling import derived_seeds

    assert seeds == derived_seeds(5, 3)  # as engine.sample draws n completions
    assert done.usage.prompt_tokens == len(source.prompts[0])
    assert done.usage.completion_tokens == sum(len(ids(tokenizer, t)) for t in texts)


@pytest.mark.parametrize("kind", KINDS)
async def test_sdk_parse_with_a_pydantic_model(tokenizer, kind):
    class City(pydantic.BaseModel):
        name: str
        country: str

    client, source = scripted(tokenizer, '{"name": "Paris", "country": "France"}')
    with Target(kind, client) as target:
        done = await target.openai().chat.completions.parse(
            model=MODEL, messages=USER, response_format=City
        )
    assert done.choices[0].message.parsed == City(name="Paris", country="France")
    assert source.params[0].constraint is not None  # held to the schema


@pytest.mark.parametrize("kind", KINDS)
def test_the_sync_client(tokenizer, kind):
    client, _ = scripted(tokenizer, ANSWER)
    with Target(kind, client) as target:
        done = target.openai(sync=True).chat.completions.create(model=MODEL, messages=USER)
    assert done.choices[0].message.content == ANSWER


@pytest.mark.parametrize("kind", KINDS)
async def test_reasoning_is_vllms_reasoning_content(tokenizer, kind):
    text = "<think>\nThe user asks about France.\n</think>\n\nParis."
    client, _ = client_for(tokenizer, text, text)
    with Target(kind, client) as target:
        sdk = target.openai()
        done = await sdk.chat.completions.create(model=MODEL, messages=USER)
        chunks = await collect(await sdk.chat.completions.create(model=MODEL, messages=USER,
                                                                 stream=True))  # fmt: skip
    message = done.choices[0].message
    assert message.content == "Paris."
    assert message.model_extra["reasoning_content"].strip() == "The user asks about France."
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
                       for c in chunks)  # fmt: skip
    assert streamed == message.model_extra["reasoning_content"]


# -- errors -----------------------------------------------------------------------------------

BAD = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "http://x/y.png"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": USER, "max_tokens": -1}, "max_tokens"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"messages": USER, "temperature": 9}, "temperature"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"parameters": {}}}]},
     "tools[0].function.name"),
    ({"messages": USER, "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"messages": USER, "colour": "red"}, "colour"),
    ({"messages": USER, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD)
def test_errors_over_http_are_openai_shaped_400s(tokenizer, body, param):
    client, _ = scripted(tokenizer, ANSWER)
    with Target("http", client) as target, target.server.http() as http:
        response = http.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize(("body", "param"), BAD[:4])
async def test_errors_in_process_are_the_sdks_exceptions(tokenizer, body, param):
    client, _ = scripted(tokenizer, ANSWER)
    with Target("inprocess", client) as target, pytest.raises(openai.BadRequestError) as info:
        await target.openai().chat.completions.create(model=MODEL, **body)
    assert info.value.param == param


def test_a_prompt_longer_than_the_context_is_a_400(tokenizer):
    client, _ = client_for(tokenizer, Script([1, 2]), context_length=64)
    long = [{"role": "user", "content": "word " * 200}]
    with Target("http", client) as target, target.server.http() as http:
        response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": long})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404(tokenizer):
    client, _ = scripted(tokenizer, ANSWER)
    with Target("http", client) as target, target.server.http() as http:
        response = http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("kind", KINDS)
async def test_continuous_usage_stats_count_the_tokens_so_far(tokenizer, kind):
    client, source = scripted(tokenizer, ANSWER)
    options = {"include_usage": True, "continuous_usage_stats": True}
    with Target(kind, client) as target:
        chunks = await collect(
            await target.openai().chat.completions.create(
                model=MODEL, messages=USER, stream=True, stream_options=options
            )
        )
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage.prompt_tokens == len(source.prompts[0]) for c in chunks)
    assert counts == sorted(counts) and counts[-1] == len(ids(tokenizer, ANSWER))
    assert chunks[-1].choices == []


def test_the_body_lm_eval_local_chat_completions_posts(tokenizer):
    """lm-eval's ``local-chat-completions`` posts plain JSON: messages, model, max_tokens,
    temperature, its ``until`` strings as ``stop`` (five with the end-of-text one) and a seed,
    and reads ``choices[i].message.content`` (a body it cannot parse scores as empty)."""
    client, _ = scripted(tokenizer, "The answer is 4.\n\nQuestion: next")
    body = {"messages": [{"role": "user", "content": "Question: 2 + 2?\nAnswer:"}],
            "model": MODEL, "max_tokens": 256, "temperature": 0, "seed": 1234,
            "stop": ["\n\n", "Question:", "Q:", "</s>", "<|im_end|>"]}  # fmt: skip
    with Target("http", client) as target, target.server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["message"]["content"] == "The answer is 4."
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_sdks_stream_helper_parses_a_typed_answer(tokenizer, kind):
    class City(pydantic.BaseModel):
        name: str

    client, _ = scripted(tokenizer, '{"name": "Paris"}')
    with Target(kind, client) as target:
        async with target.openai().chat.completions.stream(
            model=MODEL, messages=USER, response_format=City
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_completion()
    assert "content.delta" in kinds and "content.done" in kinds
    assert final.choices[0].message.parsed == City(name="Paris")


async def test_echo_starts_the_answer_with_the_last_assistant_message(tokenizer):
    client, _ = scripted(tokenizer, "4.", "4.")
    messages = [*USER, {"role": "assistant", "content": "The answer is "}]
    with Target("inprocess", client) as target:
        sdk = target.openai()
        done = await sdk.chat.completions.create(
            model=MODEL, messages=messages, extra_body={"echo": True}
        )
        chunks = await collect(
            await sdk.chat.completions.create(
                model=MODEL, messages=messages, stream=True, extra_body={"echo": True}
            )
        )
    assert done.choices[0].message.content == "The answer is 4."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The answer is 4."


JUNK = (None, -1, "x", [1], {"a": {}}, True, 10**30, 1.5)


async def test_no_value_of_any_parameter_is_a_500(tokenizer):
    """Every parameter the SDK and vLLM name, with values of every JSON type: an answer or a
    named 4xx, never a server error."""
    from nbresponses.protocol.chat import EXTENSIONS, SDK_PARAMETERS

    names = sorted((SDK_PARAMETERS | EXTENSIONS) - {"extra_body", "extra_headers", "extra_query",
                                                    "timeout", "stream"})  # fmt: skip
    client, _ = scripted(tokenizer, *["ok."] * (len(names) * len(JUNK)))
    with Target("inprocess", client) as target:
        sdk = target.openai()
        for name in names:
            for value in JUNK:
                body = {name: value} if name != "messages" else {"messages": value}
                if name == "model":
                    continue  # (a model name that is not a string: the SDK's own check)
                try:
                    await sdk.chat.completions.create(
                        **{"model": MODEL, "messages": USER, "extra_body": body}
                    )
                except openai.APIStatusError as exc:
                    assert 400 <= exc.status_code < 500, (name, value, exc)
                    if exc.status_code == 400:
                        assert exc.body["param"], (name, value, exc)


@pytest.mark.parametrize("kind", KINDS)
async def test_n_choices_streamed_each_with_its_role_and_finish(tokenizer, kind):
    texts = ["One.", "Two words."]
    client, _ = scripted(tokenizer, *texts)
    with Target(kind, client) as target:
        chunks = await collect(
            await target.openai().chat.completions.create(
                model=MODEL,
                messages=USER,
                n=2,
                seed=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    by_index: dict[int, list] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        by_index[choice.index].append(choice)
    for choices in by_index.values():
        assert choices[0].delta.role == "assistant"
        assert [c.finish_reason for c in choices][-1] == "stop"
        assert all(c.finish_reason is None for c in choices[:-1])
    contents = ["".join(c.delta.content or "" for c in by_index[i]) for i in (0, 1)]
    assert sorted(contents) == sorted(texts)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sum(
        len(ids(tokenizer, t)) for t in texts
    )


async def test_closing_a_stream_stops_its_generations(tokenizer):
    client, _ = scripted(tokenizer, "word " * 200, delay=0.01)
    stream = await client.chat.completions.create(messages=USER, stream=True)
    first = await anext(aiter(stream))
    assert first.choices[0].delta.role == "assistant"
    await stream.close()
    (choice,) = stream._choices
    assert choice.run.done.is_set() and choice.run.response.status == "cancelled"
    assert choice.run.response.usage.output_tokens < 200


@pytest.mark.parametrize("kind", KINDS)
async def test_parallel_tool_calls_streamed_with_their_own_indices(tokenizer, kind):
    calls = (
        tool_call("get_weather", {"city": "Oslo"})
        + "\n"
        + tool_call("get_weather", {"city": "Rome"})
    )
    client, _ = scripted(tokenizer, calls, calls)
    request = {"model": MODEL, "messages": USER, "tools": [WEATHER]}
    with Target(kind, client) as target:
        sdk = target.openai()
        whole = await sdk.chat.completions.create(**request)
        chunks = await collect(await sdk.chat.completions.create(**request, stream=True))
    made = whole.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in made] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert len({c.id for c in made}) == 2
    heads = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if d.id]
    assert [d.index for d in heads] == [0, 1]
    again = folded(chunks).choices[0].message.tool_calls
    assert [c.function.arguments for c in again] == [c.function.arguments for c in made]


@pytest.mark.parametrize("kind", KINDS)
async def test_json_object_and_a_non_strict_schema_are_held_by_grammar(tokenizer, kind):
    client, source = scripted(tokenizer, '{"a": 1}', '{"answer": "yes"}')
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    with Target(kind, client) as target:
        sdk = target.openai()
        one = await sdk.chat.completions.create(
            model=MODEL, messages=USER, response_format={"type": "json_object"}
        )
        two = await sdk.chat.completions.create(
            model=MODEL, messages=USER, response_format={"type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema}},
        )  # fmt: skip
    assert json.loads(one.choices[0].message.content) == {"a": 1}
    assert json.loads(two.choices[0].message.content) == {"answer": "yes"}
    assert all(p.constraint is not None for p in source.params)
