"""Function tools in the chat family on the scripted source and the real SmolLM2 tokenizer:
what the prompt offers, which calls the grammar lets out, and when the turn ends, per
``tool_choice`` and ``parallel_tool_calls``."""

from __future__ import annotations

import json

import pytest
from helpers.responses import (
    CALL,
    WEATHER,
    check_stream,
    client_for,
    dumps,
    fold,
    prompt_text,
    stream_events,
)


async def test_tool_call_streamed_and_prompted(tokenizer):
    client, source = client_for(tokenizer, "Checking.\n" + CALL)
    events = await stream_events(client, input="Weather in Zürich?", tools=[WEATHER])
    check_stream(events)
    assert "<tools>" in prompt_text(tokenizer, source)  # SmolLM2 ignores tools: injected
    r = events[-1].response
    assert [i.type for i in r.output] == ["message", "function_call"]
    call = r.output[1]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Zürich"}
    assert call.status == "completed"
    arg_deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(arg_deltas) > 2
    assert dumps(fold(events).output) == dumps(r.output)


async def test_several_calls_and_parallel_off(tokenizer):
    two = CALL + "\n" + CALL.replace("Zürich", "Bern")
    client, source = client_for(tokenizer, two, two)
    r = await client.responses.create(input="q", tools=[WEATHER])
    assert [json.loads(i.arguments)["city"] for i in r.output] == ["Zürich", "Bern"]
    r = await client.responses.create(input="q", tools=[WEATHER], parallel_tool_calls=False)
    assert len(r.output) == 1 and r.status == "completed"
    assert source.cancelled == 1  # generation stopped after the first call


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{get_weather: Zürich}\n</tool_call>",  # not JSON
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": Zürich}}\n</tool_call>',
        '<tool_call>\n{"name": "get_wetter", "arguments": {"city": "Zürich"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Zürich"}}\n</tool_call>',
    ],
)
async def test_a_call_the_tools_do_not_allow_cannot_come_out(tokenizer, bad):
    """With tools (auto), text is free until a <tool_call> opens; from there the grammar holds
    the name to the tools' and the arguments to the (strict) schema. The scripted source
    applies the mask and cannot pick another token, so the run fails where the script breaks
    the grammar; nothing of the broken call is returned as a call."""
    client, _ = client_for(tokenizer, bad)
    events = await stream_events(client, input="q", tools=[WEATHER])
    check_stream(events)
    r = events[-1].response
    assert r.status == "failed" and "grammar refuses" in r.error.message
    assert not [i for i in r.output if i.type == "function_call" and i.status == "completed"]


async def test_tool_choice_modes(tokenizer):
    client, source = client_for(tokenizer, CALL, CALL, '{"city": "Bern"}}\n</tool_call>')
    r = await client.responses.create(input="q", tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in prompt_text(tokenizer, source) and r.output_text == CALL
    await client.responses.create(input="q", tools=[WEATHER], tool_choice="required")
    assert prompt_text(tokenizer, source).endswith("assistant\n<tool_call>\n")
    r = await client.responses.create(
        input="q", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert prompt_text(tokenizer, source).endswith('{"name": "get_weather", "arguments": ')
    assert r.output[0].name == "get_weather" and json.loads(r.output[0].arguments) == {
        "city": "Bern"
    }
    assert r.tool_choice.name == "get_weather"
