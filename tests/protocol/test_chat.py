"""``chat.completions.create`` parameters as ``protocol/chat.py`` reads them (no model): the
Responses request each choice runs, chat's own parts, the 400s that name the chat parameter,
and the shapes of the objects built (the SDK's own types)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from nbresponses.protocol import chat
from nbresponses.protocol.chat import ChatRequest, ToolCall, parse_chat
from nbresponses.protocol.events import TokenLogprob
from nbresponses.protocol.request import LOGPROBS_INCLUDE

USER = [{"role": "user", "content": "Hi"}]
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
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def parse(**kwargs: Any) -> ChatRequest:
    return parse_chat({"messages": USER, **kwargs}, model="m")


def error(**kwargs: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        parse(**kwargs)
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict)
    return body


# -- messages ---------------------------------------------------------------------------------


def test_every_role_and_content_form_becomes_responses_items():
    """Text parts, developer/system, an assistant turn with reasoning, content null and tool
    calls, a tool result as a string and as parts, a second system message later."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text",
                                                                            "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [call],
         "reasoning_content": "Let me look."},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}], "name": "bot"},
        {"role": "system", "content": "Answer in JSON next time."},
        {"role": "user", "content": "And now?"},
    ]  # fmt: skip
    req = parse_chat({"messages": messages, "tools": [WEATHER]}, model="m")
    items = req.create.input
    kinds = [type(i) for i in items]
    assert kinds == [
        ResponseInputMessageItem,
        ResponseInputMessageItem,
        ResponseReasoningItem,
        ResponseFunctionToolCallItem,
        ResponseFunctionToolCallOutputItem,
        ResponseOutputMessage,
        ResponseInputMessageItem,
        ResponseInputMessageItem,
    ]
    assert items[0].role == "developer" and items[0].content[0].text == "Be brief."
    assert items[3].call_id == "call_1" and items[3].arguments == '{"city": "Paris"}'
    assert items[4].call_id == "call_1" and items[4].output == "sunny"
    assert items[5].content[0].text == "Sunny."
    assert items[6].role == "system"
    assert items[2].content[0].text == "Let me look."


def test_a_tool_result_given_as_parts_is_their_text():
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    parts = [{"type": "text", "text": "ok"}]
    messages = [*USER, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": parts}]  # fmt: skip
    req = parse_chat({"messages": messages}, model="m")
    assert req.create.input[-1].output == "ok"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
         "messages[0].content[0].type"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "function", "name": "f", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        ([{"role": "tool", "content": "x", "tool_call_id": "nope"}], "messages[0].tool_call_id"),
        ([{"role": "assistant", "content": None}], "messages[0].content"),
        ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                "function": {"name": "f"}}]}],
         "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"type": "function",
                                                "function": {"name": "f", "arguments": "{}"}}]}],
         "messages[0].tool_calls[0].id"),
        ([{"role": "user", "content": "x", "colour": "red"}], "messages[0].colour"),
        ([{"role": "assistant", "content": "x", "audio": {"id": "a"}}], "messages[0].audio"),
        ([], "messages"),
        ("Hi", "messages"),
    ],
)  # fmt: skip
def test_a_bad_message_is_a_400_naming_it(messages, param):
    with pytest.raises(openai.BadRequestError) as info:
        parse_chat({"messages": messages}, model="m")
    assert info.value.body["param"] == param


def test_messages_are_required():
    with pytest.raises(openai.BadRequestError) as info:
        parse_chat({}, model="m")
    assert info.value.body["param"] == "messages"


# -- tools, tool_choice, response_format ------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "mode", "forced"),
    [
        ("auto", "auto", None),
        ("none", "none", None),
        ("required", "required", None),
        ({"type": "function", "function": {"name": "get_weather"}}, "required", "get_weather"),
    ],
)
def test_tools_and_tool_choice_become_the_responses_ones(choice, mode, forced):
    req = parse(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False)
    create = req.create
    assert [t.name for t in create.tools] == ["get_weather"]
    assert create.tools[0].strict is True
    assert create.tools[0].parameters == WEATHER["function"]["parameters"]
    assert (create.tool_mode, create.forced_tool) == (mode, forced)
    assert create.parallel_tool_calls is False


def test_a_tool_without_strict_is_the_responses_default():
    """langchain's bind_tools sends neither strict nor additionalProperties: the Responses
    path's rule for a function tool without ``strict`` applies unchanged."""
    loose = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    from nbresponses.protocol.request import parse_create

    want = parse_create(
        {"input": "q", "tools": [{"type": "function", "name": "f", "parameters": {"type":
                                                                               "object"}}]},
        model="m",
    ).tools  # fmt: skip
    assert parse(tools=[loose]).create.tools == want


def test_allowed_tools_keeps_the_tools_it_names():
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    named = [{"type": "function", "function": {"name": "get_weather"}}]
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": named}}
    create = parse(tools=[WEATHER, other], tool_choice=choice).create
    assert [t.name for t in create.tools] == ["get_weather"]
    assert create.tool_mode == "required"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]},
         "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "custom", "custom": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools",
          "allowed_tools": {"mode": "auto", "tools": [{"type": "function",
                                                        "function": {"name": "x"}}]}}},
         "tool_choice.allowed_tools.tools[0]"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b",
                                                                     "schema": SCHEMA}}},
         "response_format.json_schema.name"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
         "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_a_bad_tool_or_format_is_a_400_naming_the_chat_parameter(kwargs, param):
    assert error(**kwargs)["param"] == param


@pytest.mark.parametrize("strict", [True, False, None])
def test_response_format_becomes_text_format(strict):
    spec = {"name": "answer", "schema": SCHEMA}
    if strict is not None:
        spec["strict"] = strict
    req = parse(response_format={"type": "json_schema", "json_schema": spec})
    assert req.create.text_format == {"type": "json_schema", "name": "answer",
                                      "schema": SCHEMA, "strict": bool(strict)}  # fmt: skip
    assert parse(response_format={"type": "json_object"}).create.text_format == {
        "type": "json_object"
    }
    assert parse(response_format={"type": "text"}).create.text_format is None


# -- sampling, limits, logprobs, n, stop, stream_options --------------------------------------


def test_sampling_and_limits_reach_the_responses_request():
    req = parse(temperature=0.5, top_p=0.9, seed=7, max_completion_tokens=12, logprobs=True,
                top_logprobs=3, n=4, stop=["a", "b", "c", "d", "e"])  # fmt: skip
    create = req.create
    assert (create.temperature, create.top_p, create.seed) == (0.5, 0.9, 7)
    assert create.max_output_tokens == 12
    assert create.logprobs and create.top_logprobs == 3 and create.include == [LOGPROBS_INCLUDE]
    assert create.store is False and create.stream is False
    assert req.n == 4 and req.stop == ["a", "b", "c", "d", "e"]  # any number of stops (vLLM)


def test_the_deprecated_max_tokens_is_the_limit_too():
    assert parse(max_tokens=5).create.max_output_tokens == 5
    assert parse(max_completion_tokens=6, max_tokens=5).create.max_output_tokens == 6


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"max_completion_tokens": "9"}, "max_completion_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": -1}, "top_p"),
        ({"seed": 2**63}, "seed"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=True
        ({"logprobs": "yes"}, "logprobs"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"stop": 3}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # needs stream
        ({"stream": True, "stream_options": {"include_usage": 1}},
         "stream_options.include_usage"),
        ({"stream": True, "stream_options": {"colour": True}}, "stream_options.colour"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"50": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "huge"}, "reasoning_effort"),
        ({"colour": "red"}, "colour"),
        ({"top_k": -2}, "top_k"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"add_generation_prompt": False}, "add_generation_prompt"),
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"documents": []}}, "chat_template_kwargs.documents"),
        ({"logprobs_mode": "processed_logprobs"}, "logprobs_mode"),  # needs logprobs
        ({"service_tier": "flex"}, "service_tier"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_400_naming_the_chat_parameter(kwargs, param):
    body = error(**kwargs)
    assert body["param"] == param
    assert "max_output_tokens" not in body["message"] and "text.format" not in body["message"]


def test_the_model_must_be_this_one():
    with pytest.raises(openai.NotFoundError):
        parse(model="gpt-5")
    assert parse(model="m").create.model == "m"


def test_stream_options_and_vllm_switches():
    req = parse(stream=True, stream_options={"include_usage": True,
                                             "continuous_usage_stats": False})  # fmt: skip
    assert req.stream and req.include_usage and not req.options.continuous_usage_stats
    assert parse(chat_template_kwargs={"enable_thinking": False}).create.reasoning.effort == "none"
    assert parse(add_generation_prompt=True, continue_final_message=False, top_k=-1).n == 1
    assert parse(modalities=["text"], store=False, user="u", metadata={"a": "b"}).n == 1


def test_echo_reads_a_final_assistant_message():
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    assert parse_chat({"messages": messages, "echo": True}, model="m").echo_text == "The answer is"
    assert parse(echo=True).echo_text == ""


def test_sdk_sentinels_and_extra_body_are_read_as_the_sdk_sends_them():
    req = parse(temperature=openai.NOT_GIVEN, extra_body={"top_k": -1, "seed": 3})
    assert req.create.temperature == 1.0 and req.create.seed == 3


# -- shapes -----------------------------------------------------------------------------------

LP = TokenLogprob(token="Hi", bytes=[72, 105], logprob=-0.5, top=[("Hi", [72, 105], -0.5)])


def test_a_choice_validates_as_the_sdks_chat_completion():
    calls = [ToolCall(0, "call_1", "get_weather", '{"city": "Paris"}')]
    choice = chat.choice(0, content=None, reasoning="hmm", calls=calls,
                         finish_reason="tool_calls", logprobs=[LP])  # fmt: skip
    done = chat.completion("chatcmpl-1", 1, "m", [choice], chat.usage(10, 3, 4, 1))
    again = ChatCompletion.model_validate_json(done.model_dump_json())
    assert again == done
    message = again.choices[0].message
    assert message.content is None and message.tool_calls[0].function.name == "get_weather"
    assert message.model_extra == {"reasoning_content": "hmm"}
    assert again.choices[0].logprobs.content[0].bytes == [72, 105]
    assert again.usage.prompt_tokens_details.cached_tokens == 4
    assert again.usage.total_tokens == 13


def test_a_first_tool_call_delta_has_id_type_and_name_then_only_arguments():
    call = ToolCall(0, "call_1", "get_weather")
    first = chat.delta_choice(0, calls=[(call, True, "")])
    later = chat.delta_choice(0, calls=[(call, False, '{"ci')])
    chunk = chat.chunk("chatcmpl-1", 1, "m", [first, later])
    again = ChatCompletionChunk.model_validate_json(chunk.model_dump_json())
    one, two = (c.delta.tool_calls[0] for c in again.choices)
    assert (one.index, one.id, one.type, one.function.name) == (0, "call_1", "function",
                                                                "get_weather")  # fmt: skip
    assert (two.id, two.type, two.function.name, two.function.arguments) == (None, None, None,
                                                                             '{"ci')  # fmt: skip


def test_arguments_json_tells_a_cut_call():
    assert chat.arguments_json('{"unit": "c"}')
    assert not chat.arguments_json('{"unit": "f')
    assert not chat.arguments_json("[1]")


def test_top_k_logit_bias_and_seeds_are_the_request_cores():
    """The rules are ``protocol/generation.py``'s: the same values as the other APIs."""
    from nbresponses.protocol.generation import parse_sampling
    from nbresponses.runtime.sampling import derived_seeds

    req = parse(top_k=5, logit_bias={"50": 10, 7: -100}, seed=11, n=3, temperature=0.7, top_p=0)
    assert req.sampling == parse_sampling(
        {"top_k": 5, "logit_bias": {"50": 10, 7: -100}, "seed": 11, "temperature": 0.7, "top_p": 0}
    )
    assert req.sampling.greedy  # top_p=0 is greedy, on every API
    assert req.choice_seeds() == derived_seeds(11, 3)
    assert parse(seed=11).choice_seeds() == [11]  # one choice: the seed itself
