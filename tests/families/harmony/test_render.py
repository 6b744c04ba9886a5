"""Rendering Responses-style requests for gpt-oss, checked token for token against harmony."""

from __future__ import annotations

from datetime import date

import pytest
from helpers.responses import WEATHER
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseFunctionToolCall,
    ResponseReasoningItem,
)
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from nbresponses.families.harmony import (
    continuation_ids,
    render_request,
)
from nbresponses.tools.base import tool_message
from nbresponses.tools.python import PythonTool
from nbresponses.tools.python import description as python_description

TODAY = date(2026, 11, 29)


def system(effort: ReasoningEffort = ReasoningEffort.MEDIUM) -> Message:
    content = (
        SystemContent.new()
        .with_reasoning_effort(effort)
        .with_conversation_start_date("2026-11-29")
        .with_knowledge_cutoff("2024-06")
    )
    return Message.from_role_and_content(Role.SYSTEM, content)


def developer(instructions: str | None, tools: bool = True) -> Message:
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools(
            [ToolDescription.new(WEATHER["name"], WEATHER["description"], WEATHER["parameters"])]
        )
    return Message.from_role_and_content(Role.DEVELOPER, content)


def user(text: str) -> Message:
    return Message.from_role_and_content(Role.USER, text)


def assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def call(args: str) -> Message:
    return (
        assistant(args, "commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json")
    )


def weather_output(text: str) -> Message:
    author = Author.new(Role.TOOL, "functions.get_weather")
    return (
        Message.from_author_and_content(author, text)
        .with_recipient("assistant")
        .with_channel("commentary")
    )


def expected(enc: HarmonyEncoding, messages: list[Message]) -> list[int]:
    return enc.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT
    )


def test_single_turn_with_instructions_tools_and_effort(enc: HarmonyEncoding) -> None:
    prompt = render_request(
        enc,
        "Weather in Paris?",
        instructions="Answer briefly.",
        tools=[WEATHER],
        reasoning={"effort": "high"},
        today=TODAY,
    )
    want = expected(
        enc, [system(ReasoningEffort.HIGH), developer("Answer briefly."), user("Weather in Paris?")]
    )
    assert prompt.token_ids == want
    assert enc.decode(prompt.token_ids).endswith("<|start|>assistant")
    assert {enc.decode([t]) for t in prompt.stop_token_ids} == {"<|return|>", "<|call|>"}
    assert prompt.function_names == ("get_weather",)
    assert prompt.builtin == ()


def test_plain_request_has_no_developer_message(enc: HarmonyEncoding) -> None:
    prompt = render_request(enc, [{"role": "user", "content": "Hi"}], today=TODAY)
    assert prompt.token_ids == expected(enc, [system(), user("Hi")])
    assert "<|start|>developer" not in enc.decode(prompt.token_ids)


def test_multi_turn_drops_old_reasoning_keeps_the_current_chain(enc: HarmonyEncoding) -> None:
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "OLD-THOUGHT"}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": '{"temp": 20}'},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 20 C.", "annotations": []}],
        },
        {"role": "user", "content": "And in Rome?"},
        {
            "type": "reasoning",
            "id": "rs_2",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "NEW-THOUGHT"}],
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "get_weather",
            "arguments": '{"city":"Rome"}',
        },
        {"type": "function_call_output", "call_id": "c2", "output": '{"temp": 25}'},
    ]
    prompt = render_request(enc, items, tools=[WEATHER], instructions="Be kind.", today=TODAY)
    want = expected(
        enc,
        [
            system(),
            developer("Be kind."),
            user("Weather in Paris?"),
            call('{"city":"Paris"}'),
            weather_output('{"temp": 20}'),
            assistant("It is 20 C.", "final"),
            user("And in Rome?"),
            assistant("NEW-THOUGHT", "analysis"),
            call('{"city":"Rome"}'),
            weather_output('{"temp": 25}'),
        ],
    )
    assert prompt.token_ids == want
    text = enc.decode(prompt.token_ids)
    assert "OLD-THOUGHT" not in text and "NEW-THOUGHT" in text


def test_three_turns_drop_all_earlier_analysis(enc: HarmonyEncoding) -> None:
    """harmony's own auto-drop keeps analysis after the first final; the guide (and we) don't."""
    items = [
        {"role": "user", "content": "Q1"},
        {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "T1"}]},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {
            "type": "reasoning",
            "id": "r2",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "T2"}],
        },
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Q3"},
    ]
    prompt = render_request(enc, items, today=TODAY)
    kept = [
        system(),
        user("Q1"),
        assistant("A1", "final"),
        user("Q2"),
        assistant("A2", "final"),
        user("Q3"),
    ]
    assert prompt.token_ids == expected(enc, kept)
    harmony_default = expected(
        enc,
        [
            *kept[:2],
            assistant("T1", "analysis"),
            *kept[2:4],
            assistant("T2", "analysis"),
            *kept[4:],
        ],
    )
    assert "T2" in enc.decode(harmony_default)  # the difference is real


def test_sdk_models_render_like_dicts(enc: HarmonyEncoding) -> None:
    as_dicts = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "reasoning",
            "id": "r",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "x"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    as_models = [
        EasyInputMessageParam(role="user", content="Weather in Paris?"),
        ResponseReasoningItem.model_validate(as_dicts[1]),
        ResponseFunctionToolCall(
            type="function_call", call_id="c1", name="get_weather", arguments="{}"
        ),
    ]
    a = render_request(enc, as_dicts, tools=[WEATHER], today=TODAY)
    b = render_request(enc, as_models, tools=[WEATHER], today=TODAY)
    assert a.token_ids == b.token_ids


def test_builtin_tools_in_the_system_message(enc: HarmonyEncoding) -> None:
    tools = [{"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "web_search"}]
    prompt = render_request(enc, "Compute 2**100", tools=tools, today=TODAY)
    python = ToolNamespaceConfig(name="python", description=python_description(), tools=[])
    content = system().content[0]
    assert isinstance(content, SystemContent)
    sys_msg = Message.from_role_and_content(
        Role.SYSTEM, content.with_browser_tool().with_tools(python)
    )
    assert prompt.token_ids == expected(enc, [sys_msg, user("Compute 2**100")])
    assert prompt.builtin == ("browser", "python")
    text = enc.decode(prompt.token_ids)
    assert "## python" in text and "## browser" in text and "/mnt/data" not in text
    off = render_request(enc, "x", tools=tools, builtin=[], today=TODAY)
    assert off.token_ids == expected(enc, [system(), user("x")])


def test_code_interpreter_history_replays_code_and_logs(enc: HarmonyEncoding) -> None:
    items = [
        {"role": "user", "content": "2**100?"},
        {
            "type": "code_interpreter_call",
            "id": "ci_1",
            "code": "2**100",
            "container_id": "local",
            "status": "completed",
            "outputs": [{"type": "logs", "logs": "1267650600228229401496703205376\n"}],
        },
    ]
    prompt = render_request(enc, items, builtin=[PythonTool.namespace()], today=TODAY)
    text = enc.decode(prompt.token_ids)
    assert "<|start|>assistant to=python<|channel|>analysis code<|message|>2**100<|call|>" in text
    assert (
        "<|start|>python to=assistant<|channel|>analysis<|message|>"
        "1267650600228229401496703205376\n<|end|>"
    ) in text


def test_system_and_developer_inputs(enc: HarmonyEncoding) -> None:
    items = [
        {"role": "system", "content": "Sys rule."},
        {"role": "user", "content": "Hi"},
        {"role": "developer", "content": [{"type": "input_text", "text": "Late rule."}]},
    ]
    prompt = render_request(enc, items, instructions="Top rule.", today=TODAY)
    late = Message.from_role_and_content(Role.DEVELOPER, "Late rule.")
    want = expected(
        enc, [system(), developer("Top rule.\n\nSys rule.", tools=False), user("Hi"), late]
    )
    assert prompt.token_ids == want


def test_preamble_phase_renders_on_commentary(enc: HarmonyEncoding) -> None:
    items = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "phase": "commentary", "content": "Checking."},
    ]
    prompt = render_request(enc, items, today=TODAY)
    assert prompt.token_ids == expected(
        enc, [system(), user("Hi"), assistant("Checking.", "commentary")]
    )


@pytest.mark.parametrize(
    "items, match",
    [
        ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "no function_call"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
            "text only",
        ),
        ([{"type": "item_reference", "id": "msg_1"}], "item_reference"),
        ([{"role": "wizard", "content": "x"}], "role"),
    ],
)
def test_unrenderable_input_raises(enc: HarmonyEncoding, items: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render_request(enc, items, today=TODAY)


def test_bad_effort_raises(enc: HarmonyEncoding) -> None:
    with pytest.raises(ValueError, match="effort"):
        render_request(enc, "x", reasoning={"effort": "galaxy"}, today=TODAY)


def test_continuation_after_a_call_matches_a_full_render(enc: HarmonyEncoding) -> None:
    base = [system(), developer(None), user("Weather in Paris?"), call('{"city":"Paris"}')]
    tool = tool_message("functions.get_weather", '{"temp": 20}', channel="commentary")
    assert tool == weather_output('{"temp": 20}')
    full = expected(enc, [*base, tool])
    cont = continuation_ids(enc, tool)
    assert full[-len(cont) :] == cont
    assert full[: -len(cont)] == enc.render_conversation(Conversation.from_messages(base))
