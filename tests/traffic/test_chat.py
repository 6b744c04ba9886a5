"""Recorded Chat Completions and Completions traffic, read as Responses events.

Expectations come from the recordings themselves: the raw chunks' fields joined in the test,
and the openai SDK's own fold of a chat stream (``ChatCompletionStreamState``), never from
the reader under test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.recorded_chat import load
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from nbresponses.traffic.chat import ChoiceReader, EventReader, as_events, as_response, usage_of

CHAT_STREAMS = [
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


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    last = events[-1]
    assert last["type"] in ("response.completed", "response.incomplete", "response.failed")
    return last["response"]


def sdk_fold(chunks: list[dict[str, Any]]) -> ChatCompletion:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


def as_json(value: Any) -> Any:
    """SDK objects (the logprob entries a ChatCompletion holds) as the JSON they are sent as."""
    return json.loads(json.dumps(value, default=lambda o: o.model_dump(mode="json")))


def items(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == kind]


def part(response: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for message in items(response, "message"):
        for content in message["content"]:
            if content["type"] == kind:
                return content
    return None


def tokens(entries: Any) -> list[tuple[str, float]]:
    def get(e: Any, k: str) -> Any:
        return e[k] if isinstance(e, dict) else getattr(e, k)

    return [(get(e, "token"), get(e, "logprob")) for e in entries or ()]


@pytest.mark.parametrize("name", CHAT_STREAMS)
def test_streams_fold_as_the_sdk_folds_them(name: str) -> None:
    chunks = load(name)
    folded = sdk_fold(chunks)
    for choice in folded.choices:
        events = list(as_events(chunks, choice=choice.index))
        response = terminal(events)
        message = choice.message
        text = part(response, "output_text")
        assert (text["text"] if text else None) == (message.content or None)
        refusal = part(response, "refusal")
        assert (refusal["refusal"] if refusal else None) == message.refusal
        calls = [
            (c["call_id"], c["name"], c["arguments"]) for c in items(response, "function_call")
        ]
        expected = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
        assert calls == expected
        logprobs = choice.logprobs
        assert tokens(text["logprobs"] if text else None) == tokens(logprobs and logprobs.content)
        assert tokens(refusal["logprobs"] if refusal else None) == tokens(
            logprobs and logprobs.refusal
        )
        assert response["status"] == "completed"
        assert response["usage"] == usage_of(folded.usage)
        assert response["id"] == folded.id and response["model"] == folded.model
        # the whole answer, as the SDK folded it, reads as the stream does
        whole = as_response(folded, choice.index)["output"]
        assert as_json(whole) == as_json(response["output"])
        numbers = [e["sequence_number"] for e in events]
        assert numbers == list(range(len(events)))


def test_tool_call_deltas_open_a_call_then_add_arguments() -> None:
    events = list(as_events(load("parallel_tools")))
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["name"]) for e in added] == [
        (0, "GetWeatherArgs"),
        (1, "get_stock_price"),
    ]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    by_index = {i: "".join(e["delta"] for e in deltas if e["output_index"] == i) for i in (0, 1)}
    assert by_index[0] == '{"city": "Edinburgh", "country": "GB", "units": "c"}'
    assert by_index[1] == '{"ticker": "AAPL", "exchange": "NASDAQ"}'
    one = terminal(list(as_events(load("one_tool"))))
    assert [(c["name"], c["arguments"]) for c in items(one, "function_call")] == [
        ("get_weather", '{"city":"New York City"}')
    ]


@pytest.mark.parametrize(
    ("name", "key", "reasoning_tokens"),
    [("deepseek", "reasoning_content", 34), ("openrouter", "reasoning", None)],
)
def test_reasoning_fields_become_a_reasoning_item(
    name: str, key: str, reasoning_tokens: int | None
) -> None:
    chunks = load(name)
    thinking = "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c.get("choices"))
    assert thinking
    response = terminal(list(as_events(chunks)))
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert response["output"][0]["content"][0]["text"] == thinking
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert response["usage"]["input_tokens"] == usage["prompt_tokens"]
    assert response["usage"]["output_tokens"] == usage["completion_tokens"]
    if reasoning_tokens is not None:
        assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == reasoning_tokens


def test_an_error_inside_a_stream_fails_the_response() -> None:
    chunks = load("openrouter_error")
    events = list(as_events(chunks))
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["code"], e["message"]) for e in errors] == [("400", "Token limit reached")]
    response = terminal(events)
    assert response["status"] == "failed"
    assert response["error"] == {"code": "400", "message": "Token limit reached"}
    assert response["usage"]["output_tokens"] == 10


def test_n3_choices_are_read_one_at_a_time() -> None:
    chunks = load("n3")
    texts = [
        "".join(
            ch["delta"].get("content") or ""
            for c in chunks
            for ch in c["choices"]
            if ch["index"] == k
        )
        for k in range(3)
    ]
    for k in range(3):
        assert part(terminal(list(as_events(chunks, choice=k))), "output_text")["text"] == texts[k]
    with pytest.raises(ValueError, match=r"choice=3.*\[0, 1, 2\]"):
        list(as_events(chunks, choice=3))


def test_chat_bodies() -> None:
    body = load("n2")
    for k in range(2):
        response = as_response(ChatCompletion.model_validate(body), k)
        expected = body["choices"][k]["message"]["content"]
        assert part(response, "output_text")["text"] == expected
        assert response["usage"]["total_tokens"] == body["usage"]["total_tokens"]
    vllm = load("vllm_reasoning")
    response = as_response(vllm)
    message = vllm["choices"][0]["message"]
    assert response["output"][0] == {
        "type": "reasoning",
        "id": None,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": message["reasoning"]}],
    }
    assert part(response, "output_text")["text"] == message["content"] == "2 + 2 = 4."
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == 108


def test_legacy_completions() -> None:
    body = load("legacy")
    response = as_response(Completion.model_validate(body))
    assert part(response, "output_text")["text"] == body["choices"][0]["text"]
    assert response["status"] == "incomplete"  # finish_reason "length"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    chunks = load("legacy_stream")
    streamed = terminal(list(as_events(chunks)))
    joined = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert part(streamed, "output_text")["text"] == joined
    assert streamed["usage"]["total_tokens"] == chunks[-1]["usage"]["total_tokens"]


def test_an_unfinished_stream_has_no_terminal_event() -> None:
    chunks = [
        c
        for c in load("content_logprobs")
        if not c["choices"] or not c["choices"][0].get("finish_reason")
    ]
    events = list(as_events(chunks[:3]))
    assert events[0]["type"] == "response.created"
    assert not any(
        e["type"].startswith(("response.completed", "response.incomplete")) for e in events
    )


def test_event_reader_passes_responses_events_and_splits_streams_by_id() -> None:
    a, b = load("content_logprobs"), load("one_tool")
    other = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_x"}}
    reader = EventReader()
    out = [e for item in [*a, other, *b] for e in reader.feed(item)] + reader.end()
    kinds = [e["type"] for e in out]
    assert kinds.count("response.created") == 3 and kinds.count("response.completed") == 2
    assert other in out and kinds.index("response.completed") < out.index(other)


def test_choice_must_be_an_index() -> None:
    for bad in (-1, True, "0"):
        with pytest.raises(ValueError, match="choice="):
            ChoiceReader(bad)  # type: ignore[arg-type]


def test_prompt_logprobs_alternatives_are_the_top_k_listed() -> None:
    from nbresponses.traffic.legacy import prompt_entries

    def position(own: tuple[str, int], *others: tuple[str, int]) -> dict[str, Any]:
        entries = [own, *others]
        return {str(i): {"decoded_token": t, "logprob": -float(r), "rank": r}
                for i, (t, r) in enumerate(entries)}  # fmt: skip

    inside = position(("b", 2), ("a", 1), ("c", 3))  # k = 3, the prompt token second
    outside = position(("z", 9), ("a", 1), ("b", 2), ("c", 3))
    tied = position(("t", 1), ("a", 1), ("b", 2), ("c", 3))  # rank 1, yet not listed
    got = prompt_entries([None, inside, outside, tied])
    assert [[t["token"] for t in e["top_logprobs"]] for e in got] == [["a", "b", "c"]] * 3
    assert [e["rank"] for e in got] == [2, 9, 1] and all(e["given"] for e in got)
    # every prompt token in the top 3: k is 3, not the 2 others each position lists
    got = prompt_entries(
        [position(("a", 1), ("b", 2), ("c", 3)), position(("c", 3), ("a", 1), ("b", 2))]
    )
    assert [[t["token"] for t in e["top_logprobs"]] for e in got] == [["a", "b", "c"]] * 2


def test_interleaved_parallel_call_deltas_go_to_their_calls() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [choice]}  # fmt: skip

    def call(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
        opened = {"id": f"call_{index}", "type": "function"} if name else {}
        return {"tool_calls": [{"index": index, **opened,
                                "function": {"name": name, "arguments": arguments}}]}  # fmt: skip

    chunks = [
        chunk({"role": "assistant", "content": "Checking."}),
        chunk(call(0, "", "weather")),
        chunk(call(1, '{"q"', "search")),
        chunk(call(0, '{"city":')),
        chunk(call(1, ': "x"}')),
        chunk(call(0, ' "Oslo"}')),
        chunk({}, "tool_calls"),
    ]
    response = terminal(list(as_events(chunks)))
    assert [(i["type"], i.get("name"), i.get("arguments")) for i in response["output"]] == [
        ("message", None, None),
        ("function_call", "weather", '{"city": "Oslo"}'),
        ("function_call", "search", '{"q": "x"}'),
    ]
    assert [i["call_id"] for i in items(response, "function_call")] == ["call_0", "call_1"]
    assert part(response, "output_text")["text"] == "Checking."
