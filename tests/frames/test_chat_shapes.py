"""The frames read one answer the same whichever API carried it.

One answer (the same tokens, logprobs, alternatives and usage) is written by hand in each
shape the OpenAI APIs send it: a Responses ``Response``, a ``ChatCompletion``, a Chat
Completions stream (chunks as the SDK's objects, as JSON dicts, and through the SDK's own
``Stream``), a legacy ``Completion`` and its stream. Every frame of each must equal the
Responses frame, except the columns that name the object (``response_id``, ``item_id``).
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import httpx2 as httpx  # the HTTP client this openai SDK is built on
import numpy as np
import openai
import pandas as pd
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from pandas.testing import assert_frame_equal

import nbresponses as nbr

# token, its bytes, logprob, alternatives [(token, logprob)] (top 2; the chosen token at
# position 4 is not among them), as one answer "Hello, café!"
TOKENS: list[tuple[str, list[int], float, list[tuple[str, float]]]] = [
    ("Hello", list(b"Hello"), -0.25, [("Hello", -0.25), ("Hi", -1.75)]),
    (",", list(b","), -0.5, [(",", -0.5), ("!", -1.5)]),
    (" caf", list(b" caf"), -1.0, [(" caf", -1.0), (" world", -1.25)]),
    ("bytes:\\xc3", [0xC3], -0.125, [("bytes:\\xc3", -0.125), (" e", -3.0)]),
    ("bytes:\\xa9", [0xA9], -2.5, [("a", -0.5), ("b", -1.0)]),
    ("!", list(b"!"), -0.75, [("!", -0.75), (".", -1.0)]),
]
TEXT = "Hello, café!"
USAGE = {"prompt": 7, "completion": 6, "cached": 3, "reasoning": 0}
CREATED = 1_700_000_000


def _entry(token: str, raw: list[int], logprob: float, top: list[tuple[str, float]]) -> dict:
    alternatives = [{"token": t, "bytes": _bytes_of(t), "logprob": v} for t, v in top]
    return {"token": token, "bytes": raw, "logprob": logprob, "top_logprobs": alternatives}


def _bytes_of(token: str) -> list[int]:
    if token.startswith("bytes:"):
        return list(bytes.fromhex(token[6:].replace("\\x", "")))
    return list(token.encode())


def entries(tokens: list[Any] = TOKENS) -> list[dict[str, Any]]:
    return [_entry(*t) for t in tokens]


def response(tokens: list[Any] = TOKENS, text: str = TEXT) -> Response:
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": CREATED,
            "model": "m",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "text": text,
                            "annotations": [],
                            "logprobs": entries(tokens),
                        }
                    ],
                }
            ],
            "usage": {
                "input_tokens": USAGE["prompt"],
                "input_tokens_details": {"cached_tokens": USAGE["cached"], "cache_write_tokens": 0},
                "output_tokens": USAGE["completion"],
                "output_tokens_details": {"reasoning_tokens": USAGE["reasoning"]},
                "total_tokens": USAGE["prompt"] + USAGE["completion"],
            },
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "temperature": None,
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
        }
    )


def chat_usage() -> dict[str, Any]:
    return {
        "prompt_tokens": USAGE["prompt"],
        "completion_tokens": USAGE["completion"],
        "total_tokens": USAGE["prompt"] + USAGE["completion"],
        "prompt_tokens_details": {"cached_tokens": USAGE["cached"]},
        "completion_tokens_details": {"reasoning_tokens": USAGE["reasoning"]},
    }


def chat_choice(index: int, tokens: list[Any] = TOKENS, text: str = TEXT) -> dict[str, Any]:
    return {
        "index": index,
        "finish_reason": "stop",
        "message": {"role": "assistant", "content": text, "refusal": None},
        "logprobs": {"content": entries(tokens), "refusal": None},
    }


def chat_completion(choices: list[dict[str, Any]] | None = None) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": CREATED,
            "model": "m",
            "choices": choices or [chat_choice(0)],
            "usage": chat_usage(),
        }
    )


# how the stream cuts the answer: token ranges and the text each chunk carries (the two bytes
# of "é" arrive in one chunk, as servers send whole characters)
PIECES = [((0, 1), "Hello"), ((1, 3), ", caf"), ((3, 5), "é"), ((5, 6), "!")]


def chat_chunks(index: int = 0) -> list[dict[str, Any]]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        head = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": CREATED}
        return {**head, "model": "m", "choices": choices, **extra}

    all_entries = entries()
    out = [
        chunk(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": {"content": [], "refusal": None},
                    "finish_reason": None,
                }
            ]
        )
    ]
    for (start, stop), text in PIECES:
        logprobs = {"content": all_entries[start:stop], "refusal": None}
        delta = {"index": index, "delta": {"content": text}, "logprobs": logprobs}
        out.append(chunk([{**delta, "finish_reason": None}]))
    out.append(chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": "stop"}]))
    out.append(chunk([], usage=chat_usage()))
    return out


def _legacy_logprobs(tokens: list[Any], offset: int = 0) -> dict[str, Any]:
    # OpenAI's shape: the alternatives hold the chosen token too (top k, plus it if lower)
    tops = []
    for token, _, logprob, top in tokens:
        alternatives = dict(top)
        alternatives.setdefault(token, logprob)
        tops.append(alternatives)
    texts = [_piece(t[1]) for t in tokens]
    offsets = [offset + sum(len(x) for x in texts[:i]) for i in range(len(texts))]
    return {
        "tokens": [t[0] for t in tokens],
        "token_logprobs": [t[2] for t in tokens],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _piece(raw: list[int]) -> str:
    return bytes(raw).decode("utf-8", "ignore")


def completion(**choice_extra: Any) -> Completion:
    return Completion.model_validate(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": CREATED,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": TEXT,
                    "finish_reason": "stop",
                    "logprobs": _legacy_logprobs(TOKENS),
                    **choice_extra,
                }
            ],
            "usage": chat_usage(),
        }
    )


def completion_chunks() -> list[dict[str, Any]]:
    out = []
    for n, ((start, stop), text) in enumerate(PIECES):
        last = n == len(PIECES) - 1
        choice = {
            "index": 0,
            "text": text,
            "logprobs": _legacy_logprobs(TOKENS[start:stop]),
            "finish_reason": "stop" if last else None,
        }
        out.append(
            {
                "id": "cmpl-2",
                "object": "text_completion",
                "created": CREATED,
                "model": "m",
                "choices": [choice],
                "usage": None,
            }
        )
    out.append({**out[0], "choices": [], "usage": chat_usage()})
    return out


NAMES = ["response_id", "item_id"]


def same_rows(frame: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(frame) == len(expected) > 0
    assert_frame_equal(frame.drop(columns=NAMES), expected.drop(columns=NAMES))


def _sdk_stream(chunks: list[dict[str, Any]]) -> Any:
    """The openai SDK's own ``Stream`` of ChatCompletionChunk, read from recorded SSE bytes."""
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=body.encode())

    client = openai.OpenAI(
        api_key="test",
        base_url="http://api.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, logprobs=True
    )


SHAPES = {
    "chat": lambda: chat_completion(),
    "chat_dict": lambda: chat_completion().model_dump(mode="json"),
    "chat_stream_objects": lambda: [ChatCompletionChunk.model_validate(c) for c in chat_chunks()],
    "chat_stream_dicts": chat_chunks,
    "chat_sdk_stream": lambda: _sdk_stream(chat_chunks()),
    "completion": lambda: completion(),
    "completion_dict": lambda: completion().model_dump(mode="json"),
    "completion_stream": completion_chunks,
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logprobs_frame_is_the_responses_frame(shape: str) -> None:
    expected = nbr.logprobs_frame(response())
    frame = nbr.logprobs_frame(SHAPES[shape]())
    same_rows(frame, expected)
    assert "".join(frame["text"]) == TEXT
    assert frame["output_index"].eq(0).all() and frame["item_id"].isna().all()
    assert not frame["given"].any()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_top_logprobs_frame_is_the_responses_frame(shape: str) -> None:
    expected = nbr.top_logprobs_frame(response())
    frame = nbr.top_logprobs_frame(SHAPES[shape]())
    same_rows(frame, expected)
    # the chosen "bytes:\xa9" ranks below both alternatives: no alternative row is chosen there
    at4 = frame[frame.position == 4]
    assert list(at4.token) == ["a", "b"] and not at4.chosen.any()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_words_and_sums_are_the_responses_ones(shape: str) -> None:
    answer = SHAPES[shape]()
    if shape == "chat_sdk_stream":
        answer = list(answer)  # a stream is read once; two frames are asked of it here
    same_rows_words = nbr.words_frame(answer).drop(columns=["response_id"])
    expected = nbr.words_frame(response()).drop(columns=["response_id"])
    assert_frame_equal(same_rows_words, expected)
    assert list(expected.text) == ["Hello,", "café!"]
    total = sum(t[2] for t in TOKENS)
    assert nbr.sequence_logprob(answer).iloc[0] == pytest.approx(total)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_usage_frame_reads_completion_usage(shape: str) -> None:
    frame = nbr.usage_frame(SHAPES[shape]())
    expected = nbr.usage_frame(response())
    tokens = ["input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "total_tokens"]
    assert_frame_equal(
        frame[[*tokens, "status", "model", "created_at"]].astype(object),
        expected[[*tokens, "status", "model", "created_at"]].astype(object),
    )
    assert list(frame.loc[0, tokens]) == [7, 3, 6, 0, 13]
    assert frame.loc[0, "streamed"] == ("stream" in shape)
    assert frame.loc[0, "response_id"] in ("chatcmpl-1", "chatcmpl-2", "cmpl-1", "cmpl-2")


def test_choice_picks_one_of_n() -> None:
    other = [("Bye", list(b"Bye"), -0.5, [("Bye", -0.5)]), ("!", list(b"!"), -0.25, [])]
    answer = chat_completion([chat_choice(0), chat_choice(1, other, "Bye!")])
    same_rows(nbr.logprobs_frame(answer, choice=0), nbr.logprobs_frame(response()))
    second = nbr.logprobs_frame(answer, choice=1)
    same_rows(second, nbr.logprobs_frame(response(other, "Bye!")))
    with pytest.raises(ValueError, match=r"choice=2.*\[0, 1\]"):
        nbr.logprobs_frame(answer, choice=2)
    with pytest.raises(ValueError, match="choice="):
        nbr.logprobs_frame(answer, choice=-1)
    # a stream whose chunks carry choice 1 only (as n=2 streams interleave them)
    streamed = nbr.logprobs_frame(chat_chunks(index=1), choice=1)
    same_rows(streamed, nbr.logprobs_frame(response()))
    assert nbr.usage_frame(answer, choice=1).loc[0, "output_tokens"] == USAGE["completion"]


def test_time_pairs_and_times_give_stream_timing() -> None:
    chunks = chat_chunks()
    times = [10.0 + i for i in range(len(chunks))]
    by_pairs = nbr.usage_frame(list(zip(times, chunks, strict=True)))
    by_times = nbr.usage_frame(chunks, times=times)
    assert_frame_equal(by_pairs, by_times)
    row = by_pairs.iloc[0]
    # the first chunk (role only) starts the clock; the first text arrives at 11 s, the usage
    # chunk (the last) ends the stream
    assert row.ttft_s == 1.0 and row.duration_s == len(chunks) - 1
    assert row.tokens_per_s == pytest.approx(6 / (len(chunks) - 2))


def test_an_async_stream_is_refused_with_a_hint() -> None:
    class Chunks:
        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            raise StopAsyncIteration

    with pytest.raises(TypeError, match=r"async for"):
        nbr.logprobs_frame(Chunks())


def test_sdk_chat_completion_stream_events_are_read_for_their_chunks() -> None:
    # client.chat.completions.stream(...) yields ChunkEvent(type="chunk", chunk=...) among
    # content.delta events that repeat the same text: only the chunks are read
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state = ChatCompletionStreamState()
    events = []
    for raw in chat_chunks():
        events += state.handle_chunk(ChatCompletionChunk.model_validate(raw))
    assert {e.type for e in events} >= {"chunk", "content.delta", "logprobs.content.delta"}
    same_rows(nbr.logprobs_frame(events), nbr.logprobs_frame(response()))
    folded = state.get_final_completion()  # the SDK's own fold of the stream
    same_rows(nbr.logprobs_frame(folded), nbr.logprobs_frame(response()))


def test_refusal_logprobs_are_read() -> None:
    refused = chat_choice(0)
    refused["message"] = {"role": "assistant", "content": None, "refusal": TEXT}
    refused["logprobs"] = {"content": None, "refusal": entries()}
    frame = nbr.logprobs_frame(chat_completion([refused]))
    same_rows(frame, nbr.logprobs_frame(response()))


def test_incomplete_status_from_finish_reason() -> None:
    cut = chat_choice(0)
    cut["finish_reason"] = "length"
    usage = nbr.usage_frame(chat_completion([cut]))
    assert usage.loc[0, "status"] == "incomplete"


# ------------------------------------------------------------------ legacy echo and prompts

PROMPT = [("The", list(b"The"), None, []), (" cat", list(b" cat"), -3.5, [(" dog", -1.0)])]


def _echoed(**extra: Any) -> Completion:
    tokens = [*PROMPT, *TOKENS]
    return Completion.model_construct(  # a null logprob: the SDK's type says float
        id="cmpl-echo",
        object="text_completion",
        created=CREATED,
        model="m",
        choices=[
            {
                "index": 0,
                "text": "The cat" + TEXT,
                "finish_reason": "stop",
                "logprobs": _legacy_logprobs(tokens),
                **extra,
            }
        ],
        usage={"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8},
    )


def test_echo_puts_the_prompt_first_as_given_tokens() -> None:
    frame = nbr.logprobs_frame(_echoed().model_dump(mode="json"))
    assert list(frame.given) == [True, True] + [False] * len(TOKENS)
    assert math.isnan(frame.logprob[0]) and frame.logprob[1] == -3.5
    assert "".join(frame.text) == "The cat" + TEXT
    generated = frame[~frame.given].reset_index(drop=True)
    expected = nbr.logprobs_frame(response())
    moved = [*NAMES, "position", "char_offset", "byte_offset"]
    categories = ["token", "runner_up"]  # the echo adds the prompt's tokens to the categories
    assert_frame_equal(
        generated.drop(columns=moved).astype(dict.fromkeys(categories, object)),
        expected.drop(columns=moved).astype(dict.fromkeys(categories, object)),
    )
    assert list(generated.position) == list(range(2, 2 + len(TOKENS)))


def test_vllm_prompt_logprobs_give_the_prompt_ranks() -> None:
    positions = [
        None,
        {
            "11": {"logprob": -3.5, "rank": 4, "decoded_token": " cat"},
            "12": {"logprob": -1.0, "rank": 1, "decoded_token": " dog"},
        },
    ]
    frame = nbr.logprobs_frame(_echoed(prompt_logprobs=positions).model_dump(mode="json"))
    assert frame["rank"][1] == 4  # vLLM's exact rank, not the rank among the alternatives
    assert frame["rank"].isna()[0] and frame["rank"][2] == 1
    # without echo: the prompt positions that have a logprob come first
    plain = completion(prompt_logprobs=positions).model_dump(mode="json")
    frame = nbr.logprobs_frame(plain)
    assert list(frame.token[:2]) == [" cat", "Hello"] and list(frame.given[:2]) == [True, False]
    assert frame["rank"][0] == 4
    top = nbr.top_logprobs_frame(plain)
    assert list(top[top.position == 0].token) == [" dog"]  # rank 4 is outside the 2 sent


def test_a_streamed_echo_is_its_first_chunk() -> None:
    chunks = completion_chunks()
    echo = {
        **chunks[0],
        "choices": [
            {
                "index": 0,
                "text": "The cat",
                "finish_reason": None,
                "logprobs": _legacy_logprobs(PROMPT),
            }
        ],
    }
    frame = nbr.logprobs_frame([echo, *chunks])
    assert list(frame.given) == [True, True] + [False] * len(TOKENS)
    assert "".join(frame.text) == "The cat" + TEXT


def test_error_bodies_and_answers_without_logprobs() -> None:
    error = {"error": {"message": "nope", "type": "invalid_request_error", "code": None}}
    bare = chat_completion([{**chat_choice(0), "logprobs": None}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert nbr.logprobs_frame([error, bare]).empty
    assert any("no token logprobs" in str(w.message) for w in caught)
    usage = nbr.usage_frame([error, bare])
    assert len(usage) == 1 and usage.loc[0, "input_tokens"] == USAGE["prompt"]
    assert np.isnan(usage.loc[0, "ttft_s"])


def test_choice_none_reads_every_choice() -> None:
    other = [("Bye", list(b"Bye"), -0.5, [("Bye", -0.5)]), ("!", list(b"!"), -0.25, [])]
    answer = chat_completion([chat_choice(0), chat_choice(1, other, "Bye!")])
    frame = nbr.logprobs_frame(answer, choice=None)
    assert list(frame.response_id.unique()) == ["chatcmpl-1#0", "chatcmpl-1#1"]
    first = frame[frame.response_id == "chatcmpl-1#0"].reset_index(drop=True)
    assert_frame_equal(
        first.drop(columns=NAMES).astype(dict.fromkeys(["token", "runner_up"], object)),
        nbr.logprobs_frame(response())
        .drop(columns=NAMES)
        .astype(dict.fromkeys(["token", "runner_up"], object)),
    )
    # two interleaved streamed choices, as n=2 streams send them
    a, b = chat_chunks(0), chat_chunks(1)
    interleaved = [x for pair in zip(a[:-1], b[:-1], strict=True) for x in pair] + [a[-1]]
    streamed = nbr.logprobs_frame(interleaved, choice=None)
    assert list(streamed.response_id.unique()) == ["chatcmpl-2#0", "chatcmpl-2#1"]
    assert len(streamed) == 2 * len(TOKENS)
    usage = nbr.usage_frame(interleaved, choice=None)
    assert list(usage.response_id) == ["chatcmpl-2#0", "chatcmpl-2#1"]
    # one choice: the id stays the answer's
    assert list(nbr.usage_frame(chat_completion(), choice=None).response_id) == ["chatcmpl-1"]


def test_samples_frame_counts_the_choices_of_one_answer() -> None:
    other = [("Bye", list(b"Bye"), -0.5, []), ("!", list(b"!"), -0.25, [])]
    answer = chat_completion([chat_choice(0), chat_choice(1, other, "Bye!"), chat_choice(2)])
    samples = nbr.samples_frame(answer)
    assert samples.attrs["n"] == 3
    assert list(samples.answer) == [TEXT, "Bye!"] and list(samples["count"]) == [2, 1]
    assert samples.sequence_logprob[1] == pytest.approx(-0.75)
    assert samples.diverges_at[0] == 0
