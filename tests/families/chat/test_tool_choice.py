"""Function tools in the chat family on the scripted source and the real SmolLM2 tokenizer:
what the prompt offers, which calls the grammar lets out, and when the turn ends, per
``tool_choice`` and ``parallel_tool_calls``."""

from __future__ import annotations

import json

import pytest
from helpers.responses import (
    CALL,
    EOS,
    TIME,
    WEATHER,
    check_stream,
    client_for,
    dumps,
    fold,
    prompt_text,
    stream_events,
)

from nbresponses.families.chat.family import ChatFamily


@pytest.fixture(scope="module")
def chat(tokenizer) -> ChatFamily:
    """One family for every client here: its grammar tokenizer is built once."""
    return ChatFamily(tokenizer, eos_token_ids=(EOS,))


async def test_tool_call_streamed_and_prompted(tokenizer, chat):
    client, source = client_for(tokenizer, "Checking.\n" + CALL, family=chat)
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


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{get_weather: Zürich}\n</tool_call>",  # not JSON
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": Zürich}}\n</tool_call>',
        '<tool_call>\n{"name": "get_wetter", "arguments": {"city": "Zürich"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Zürich"}}\n</tool_call>',
    ],
)
async def test_a_call_the_tools_do_not_allow_cannot_come_out(tokenizer, chat, bad):
    """With tools (auto), text is free until a <tool_call> opens; from there the grammar holds
    the name to the tools' and the arguments to the (strict) schema. The scripted source
    applies the mask and cannot pick another token, so the run fails where the script breaks
    the grammar; nothing of the broken call is returned as a call."""
    client, _ = client_for(tokenizer, bad, family=chat)
    events = await stream_events(client, input="q", tools=[WEATHER])
    check_stream(events)
    r = events[-1].response
    assert r.status == "failed" and "grammar refuses" in r.error.message
    assert not [i for i in r.output if i.type == "function_call" and i.status == "completed"]


# -- the rules per tool_choice, each in milliseconds on one family ----------------------------
# (tests/grammar/test_structured_bundled.py checks the same cases on the real model)

NAMED = {"type": "function", "name": "get_time"}


async def reply(tokenizer, chat, script: str, **request):
    """The response to ``request`` when the model writes ``script``, and the source."""
    client, source = client_for(tokenizer, script, family=chat)
    events = await stream_events(client, input="q", **request)
    check_stream(events)
    return events[-1].response, source


def calls(response) -> list[tuple[str, dict, str]]:
    return [
        (i.name, json.loads(i.arguments) if i.status == "completed" else i.arguments, i.status)
        for i in response.output
        if i.type == "function_call"
    ]


async def test_required_answers_with_one_call_to_one_of_the_tools(tokenizer, chat):
    """The prompt opens the call; the reply is its JSON, to a tool given, and ends the turn."""
    script = '{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>'
    r, source = await reply(tokenizer, chat, script, tools=[WEATHER, TIME], tool_choice="required")
    assert prompt_text(tokenizer, source).endswith("assistant\n<tool_call>\n")
    assert r.status == "completed" and r.output_text == ""
    assert calls(r) == [("get_time", {"city": "Rome"}, "completed")]


@pytest.mark.parametrize(
    "script",
    [
        "I would rather just answer.",  # text where a call must come
        '{"name": "get_date", "arguments": {"city": "Rome"}}\n</tool_call>',  # no such tool
        '{"name": "get_time", "arguments": {"town": "Rome"}}\n</tool_call>',  # off its schema
    ],
)
async def test_required_refuses_anything_but_a_valid_call(tokenizer, chat, script):
    r, _ = await reply(tokenizer, chat, script, tools=[WEATHER, TIME], tool_choice="required")
    assert r.status == "failed" and "grammar refuses" in r.error.message
    assert not [c for c in calls(r) if c[2] == "completed"]


async def test_a_forced_call_ends_the_turn_with_parallel_calls_on(tokenizer, chat):
    """After the forced call nothing more comes out (parallel_tool_calls is on by default):
    the model's further text or calls are never read."""
    more = "\n" + CALL + "\nIt is noon in Rome."
    for choice in ("required", NAMED):
        script = '{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>' + more
        if choice == NAMED:
            script = script.removeprefix('{"name": "get_time", "arguments": ')
        r, source = await reply(tokenizer, chat, script, tools=[WEATHER, TIME], tool_choice=choice)
        assert r.parallel_tool_calls and r.status == "completed"
        assert calls(r) == [("get_time", {"city": "Rome"}, "completed")]
        assert r.output_text == "" and source.cancelled == 1  # generation stopped at the call


async def test_named_choice_writes_the_name_and_holds_the_arguments(tokenizer, chat):
    r, source = await reply(
        tokenizer, chat, '{"city": "Oslo"}}\n</tool_call>', tools=[WEATHER, TIME], tool_choice=NAMED
    )
    assert prompt_text(tokenizer, source).endswith('{"name": "get_time", "arguments": ')
    assert calls(r) == [("get_time", {"city": "Oslo"}, "completed")]
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_time"
    off_schema = '{"city": "Oslo", "unit": "c"}}\n</tool_call>'
    r, _ = await reply(tokenizer, chat, off_schema, tools=[WEATHER, TIME], tool_choice=NAMED)
    assert r.status == "failed" and "grammar refuses" in r.error.message


async def test_a_forced_call_the_budget_cannot_hold_is_not_started(tokenizer, chat):
    """Three tokens cannot hold the shortest call: nothing is generated, and the response is
    incomplete with no call (neither broken JSON arguments nor the prompt's call opener)."""
    script = '{"city": "Paris"}}\n</tool_call>'
    request = {"tools": [TIME], "tool_choice": NAMED, "max_output_tokens": 3}
    r, _ = await reply(tokenizer, chat, script, **request)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output == [] and r.usage.output_tokens == 0


AUTO_SCRIPT = "Checking.\n" + CALL
SCRIPTS = {
    "required": '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "named": '{"city": "Zürich"}}\n</tool_call>',
    "auto": AUTO_SCRIPT,
}


@pytest.mark.parametrize("choice", ["required", "named", "auto"])
async def test_no_budget_cuts_a_call_into_broken_json(tokenizer, chat, choice):
    """Issue 38: whatever ``max_output_tokens`` cuts, a call comes out whole (its arguments
    parse and match the schema: the closing ends it in time) or not at all; never a call with
    broken arguments, never the prompt's call opener as text."""
    script = SCRIPTS[choice]
    tool_choice = {"type": "function", "name": "get_weather"} if choice == "named" else choice
    full = len(tokenizer.encode(script)) + 1
    closed_early = whole = 0
    for budget in range(1, full + 2):
        request = {"tools": [WEATHER], "tool_choice": tool_choice, "max_output_tokens": budget}
        r, _ = await reply(tokenizer, chat, script, **request)
        assert r.status in ("completed", "incomplete"), (budget, r.error)
        if r.status == "incomplete":
            assert r.incomplete_details.reason == "max_output_tokens"
        for item in r.output:
            if item.type == "function_call":
                assert item.status == "completed", (budget, item.arguments)
                assert set(json.loads(item.arguments)) == {"city"}, budget
                closed_early += r.status == "incomplete"
                whole += r.status == "completed"
            else:
                assert choice == "auto" and "<tool_call>" not in r.output_text, budget
                assert '"arguments"' not in r.output_text, budget
    assert closed_early and whole  # some budgets closed the call in time, the largest let it be


async def test_auto_leaves_the_answer_free(tokenizer, chat):
    r, source = await reply(tokenizer, chat, "Hello! No tools needed.", tools=[WEATHER, TIME])
    assert "<tools>" in prompt_text(tokenizer, source)
    assert r.status == "completed" and r.output_text == "Hello! No tools needed."
    assert calls(r) == []


async def test_parallel_calls_off_lets_one_call_out(tokenizer, chat):
    """With parallel_tool_calls off the generation ends at the first call's end."""
    two = CALL + "\n" + CALL.replace("Zürich", "Bern")
    for parallel, cities in ((True, ["Zürich", "Bern"]), (False, ["Zürich"])):
        r, source = await reply(tokenizer, chat, two, tools=[WEATHER], parallel_tool_calls=parallel)
        assert r.status == "completed" and r.parallel_tool_calls is parallel
        assert len(r.output) == len(cities) and [c[1]["city"] for c in calls(r)] == cities
        assert source.cancelled == (0 if parallel else 1)


async def test_none_offers_no_tool_and_reads_calls_as_text(tokenizer, chat):
    r, source = await reply(tokenizer, chat, CALL, tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in prompt_text(tokenizer, source)
    assert r.output_text == CALL and calls(r) == []
