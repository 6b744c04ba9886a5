"""The view renders Chat Completions and Completions traffic: recorded streams (live through
the openai SDK's own stream objects, sync and async, and as lists), whole answers, ``n > 1``.

Expectations are read from the recordings (the raw chunks joined here), not from the reader.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx  # the HTTP client this openai SDK is built on
import openai
import pytest
from helpers.recorded_chat import load
from openai.types import Completion
from openai.types.chat import ChatCompletion

from nbresponses.view import ResponseView

CHAT = [
    "dotnet_logprobs",
    "content_logprobs",
    "refusal_logprobs",
    "one_tool",
    "parallel_tools",
    "n3",
    "deepseek",
    "openrouter",
    "vllm",
]


def joined(chunks: list[dict[str, Any]], key: str, index: int = 0) -> str:
    return "".join(
        choice["delta"].get(key) or ""
        for c in chunks
        for choice in c.get("choices") or ()
        if choice["index"] == index
    )


def calls(chunks: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Tool calls by index: [id, name, arguments], joined from the deltas."""
    out: dict[int, list[str]] = {}
    for c in chunks:
        for choice in c.get("choices") or ():
            for call in choice["delta"].get("tool_calls") or ():
                entry = out.setdefault(call["index"], ["", "", ""])
                function = call.get("function") or {}
                entry[0] += call.get("id") or ""
                entry[1] += function.get("name") or ""
                entry[2] += function.get("arguments") or ""
    return out


def check(view: ResponseView, chunks: list[dict[str, Any]]) -> None:
    """The view's final state against the recorded chunks."""
    response = view.state["response"]
    output = response["output"]
    kinds = [item["type"] for item in output]
    thinking = joined(chunks, "reasoning_content") or joined(chunks, "reasoning")
    if thinking:
        assert kinds[0] == "reasoning" and output[0]["content"][0]["text"] == thinking
    messages = [item for item in output if item["type"] == "message"]
    texts = [p.get("text") for m in messages for p in m["content"] if p["type"] == "output_text"]
    refusals = [p["refusal"] for m in messages for p in m["content"] if p["type"] == "refusal"]
    assert "".join(texts) == joined(chunks, "content")
    assert "".join(refusals) == joined(chunks, "refusal")
    got = [
        [i["call_id"], i["name"], i["arguments"]] for i in output if i["type"] == "function_call"
    ]
    assert got == [calls(chunks)[k] for k in sorted(calls(chunks))]
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert response["usage"]["output_tokens"] == usage["completion_tokens"]
    assert response["usage"]["input_tokens"] == usage["prompt_tokens"]
    assert view.status == "completed" and view.done
    logprobs = [
        e
        for c in chunks
        for ch in c["choices"]
        if ch.get("logprobs") and ch["index"] == 0
        for e in ch["logprobs"].get("content") or ()
    ]
    heat = [
        lp
        for m in messages
        for p in m["content"]
        if p["type"] == "output_text"
        for lp in p.get("logprobs") or ()
    ]
    assert [lp["token"] for lp in heat] == [e["token"] for e in logprobs]


@pytest.mark.parametrize("name", CHAT)
def test_a_list_of_chunks(name: str) -> None:
    chunks = load(name)
    check(ResponseView(chunks), chunks)


async def paced(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item
        await asyncio.sleep(0)


@pytest.mark.parametrize("name", ["dotnet_logprobs", "parallel_tools", "deepseek", "openrouter"])
async def test_live_chunks(name: str) -> None:
    chunks = load(name)
    view = ResponseView(paced(chunks))
    assert not view.done
    response = await view
    check(view, chunks)
    assert response.output_text == joined(chunks, "content")
    assert view.state["view"]["timing"]["ttft"] is not None


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def _handler(chunks: list[dict[str, Any]]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=_sse(chunks))

    return handler


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_openai_sdk_async_chat_stream() -> None:
    chunks = load("deepseek")
    client = openai.AsyncOpenAI(
        api_key="test",
        base_url="http://api.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(_handler(chunks))),
    )
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    view = ResponseView(stream)
    assert view.state["view"]["cancellable"]
    await view
    check(view, chunks)
    assert "34 reasoning" in view.text()


async def test_openai_sdk_sync_chat_stream_and_its_helper_events() -> None:
    chunks = load("dotnet_logprobs")
    client = openai.OpenAI(
        api_key="test",
        base_url="http://api.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(_handler(chunks))),
    )
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    view = ResponseView(stream)
    await view
    check(view, chunks)
    # client.chat.completions.stream(...): its events wrap the chunks (type "chunk")
    with client.chat.completions.stream(model="m", messages=MESSAGES) as helper:
        events = list(helper)
    check(ResponseView(events), chunks)


def test_n3_shows_the_chosen_choice() -> None:
    chunks = load("n3")
    for k in range(3):
        view = ResponseView(chunks, choice=k)
        assert view.response.output_text == joined(chunks, "content", k)
    with pytest.raises(ValueError, match="choice="):
        ResponseView(chunks, choice=-1)


def test_a_stream_error_fails_the_view() -> None:
    chunks = load("openrouter_error")
    view = ResponseView(chunks)
    assert view.status == "failed: Token limit reached"
    assert [e["message"] for e in view.state["view"]["errors"]] == ["Token limit reached"]
    assert view.state["response"]["output"][0]["content"][0]["text"] == joined(chunks, "reasoning")


def test_an_unfinished_stream_is_interrupted() -> None:
    chunks = [c for c in load("content_logprobs") if c["choices"]][:3]  # no finish, no usage
    view = ResponseView(chunks)
    assert view.status == "interrupted"
    assert view.response.output_text == joined(chunks, "content")


def test_whole_answers() -> None:
    body = load("vllm_reasoning")
    view = ResponseView(ChatCompletion.model_validate(body))
    message = body["choices"][0]["message"]
    assert view.response.output_text == message["content"]
    assert view.state["response"]["output"][0]["content"][0]["text"] == message["reasoning"]
    assert "108 reasoning" in view.text()
    n2 = load("n2")
    assert ResponseView(n2, choice=1).response.output_text == n2["choices"][1]["message"]["content"]
    legacy = load("legacy")
    view = ResponseView(Completion.model_validate(legacy))
    assert view.response.output_text == legacy["choices"][0]["text"]
    assert view.status == "incomplete (max_output_tokens)"
    stream = load("legacy_stream")
    view = ResponseView(stream)
    assert view.response.output_text == "".join(c["choices"][0]["text"] for c in stream[:-1])
    assert view.status == "incomplete (max_output_tokens)"
    error = load("error_404")
    view = ResponseView(error)
    assert view.status == f"failed: {error['error']['message']}"
    assert view.state["response"]["error"]["code"] == error["error"]["code"] == "model_not_found"
    with pytest.raises(TypeError, match="ChatCompletion"):
        ResponseView({"unknown": 1})


def test_the_html_fallback_shows_a_chat_answer() -> None:
    chunks = load("deepseek")
    data, _ = ResponseView(chunks)._repr_mimebundle_()
    html = data["text/html"]
    assert "The product of 17 and 23 is 391." in html
    assert "completed" in html
