"""vLLM's own Chat Completions checks (tests/entrypoints/openai/chat_completion/test_chat.py),
held out and rewritten for the bundled 135M model over HTTP. Where vLLM and OpenAI differ we
follow OpenAI (a stream's last chunk per choice has an empty delta and the finish reason;
usage carries OpenAI's token details) and say so beside the check."""

from __future__ import annotations

import openai
import pytest
from helpers.server import ThreadedServer

from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
MESSAGES = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is 1+1?"},
]
DIALOGUE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]


@pytest.fixture(scope="module")
def server(bundled_model):
    generator = TokenGenerator(bundled_model)
    engine = Engine(generator, store_path="memory")
    with ThreadedServer(engine.client()) as server:
        yield server, engine.model
    generator.close_sync()


async def test_logprob_counts(server):
    srv, model = server
    sdk = srv.openai()
    none = await sdk.chat.completions.create(model=model, messages=MESSAGES,
                                             max_completion_tokens=5, temperature=0)  # fmt: skip
    assert none.choices[0].logprobs is None
    for top in (0, 5):
        done = await sdk.chat.completions.create(
            model=model, messages=MESSAGES, max_completion_tokens=5, temperature=0,
            logprobs=True, top_logprobs=top,
        )  # fmt: skip
        assert all(len(t.top_logprobs) == top for t in done.choices[0].logprobs.content)


async def test_too_many_logprobs_is_a_400_and_the_server_goes_on(server):
    srv, model = server
    sdk = srv.openai()
    for stream in (True, False):
        with pytest.raises(openai.BadRequestError):
            await sdk.chat.completions.create(model=model, messages=MESSAGES, logprobs=True,
                                              top_logprobs=21, stream=stream)  # fmt: skip
    done = await sdk.chat.completions.create(model=model, messages=MESSAGES,
                                             max_completion_tokens=10)  # fmt: skip
    assert done.choices[0].message.content is not None


@pytest.mark.parametrize("prompt_logprobs", [2, 1, 0, -1, None])
async def test_prompt_logprobs(server, prompt_logprobs):
    srv, model = server
    params: dict = {"model": model, "messages": DIALOGUE, "max_completion_tokens": 5}
    if prompt_logprobs is not None:
        params["extra_body"] = {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:
        with pytest.raises(openai.BadRequestError):
            await srv.openai().chat.completions.create(**params)
        return
    done = await srv.openai().chat.completions.create(**params)
    scored = (done.model_extra or {}).get("prompt_logprobs")
    if prompt_logprobs is None:
        assert scored is None
        return
    assert len(scored) == done.usage.prompt_tokens and scored[0] is None
    for position in scored[1:]:  # the prompt's own token, and the top k (one may be it)
        assert prompt_logprobs <= len(position) <= prompt_logprobs + 1


async def test_a_session_with_a_budget(server):
    srv, model = server
    sdk = srv.openai()
    done = await sdk.chat.completions.create(model=model, messages=MESSAGES,
                                             max_completion_tokens=5, logprobs=True,
                                             top_logprobs=5, temperature=0)  # fmt: skip
    (choice,) = done.choices
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert done.usage.completion_tokens == 5  # (OpenAI's token details beside, unlike vLLM's)
    assert done.usage.total_tokens == done.usage.prompt_tokens + 5
    messages = [*MESSAGES, {"role": "assistant", "content": choice.message.content},
                {"role": "user", "content": "express your result in json"}]  # fmt: skip
    again = await sdk.chat.completions.create(model=model, messages=messages,
                                              max_completion_tokens=5)  # fmt: skip
    assert again.choices[0].message.content is not None
    assert again.usage.prompt_tokens > done.usage.prompt_tokens


async def test_streaming_equals_the_whole_answer_with_one_finish_reason(server):
    srv, model = server
    sdk = srv.openai()
    request = {"model": model, "messages": MESSAGES, "max_completion_tokens": 10,
               "temperature": 0}  # fmt: skip
    whole = await sdk.chat.completions.create(**request)
    pieces, finishes = [], []
    async for chunk in await sdk.chat.completions.create(**request, stream=True):
        choice = chunk.choices[0]
        if choice.delta.role:
            assert choice.delta.role == "assistant"
        pieces.append(choice.delta.content or "")
        if choice.finish_reason is not None:
            finishes.append(choice.finish_reason)
    assert finishes == [whole.choices[0].finish_reason]  # (OpenAI: in a last, empty delta)
    assert "".join(pieces) == whole.choices[0].message.content


async def test_stream_options(server):
    srv, model = server
    sdk = srv.openai()
    request = {"model": model, "messages": MESSAGES, "max_completion_tokens": 10,
               "temperature": 0}  # fmt: skip
    async for chunk in await sdk.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": False}
    ):
        assert chunk.usage is None
    chunks = [c async for c in await sdk.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True,
                                                "continuous_usage_stats": False})]  # fmt: skip
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    for options in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):
            await sdk.chat.completions.create(**request, stream=False, stream_options=options)
    last = 0
    async for chunk in await sdk.chat.completions.create(
        **request, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ):  # fmt: skip
        counts = chunk.usage
        assert counts.total_tokens == counts.prompt_tokens + counts.completion_tokens
        assert counts.completion_tokens >= last
        last = counts.completion_tokens
    assert last == usage.completion_tokens
