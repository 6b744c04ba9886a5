"""The harmony streaming parser on real harmony token ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseFunctionWebSearch
from openai_harmony import HarmonyEncoding, Message, Role

from nbresponses.families.harmony import (
    Event,
    HarmonyStreamParser,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    Stray,
    harmony_encoding,
)
from nbresponses.tokens.contract import TokenIdLogprob
from nbresponses.tools import BrowserTool, ToolCall
from nbresponses.tools.browser import action_of

WEATHER_CALL = (
    "<|channel|>analysis<|message|>User wants weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris"}<|call|>'
)


def ids_of(enc: HarmonyEncoding, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


def parse(
    enc: HarmonyEncoding, ids: list[int], *, logprobs: bool = False, finish: bool = True
) -> tuple[list[Event], HarmonyStreamParser]:
    parser = HarmonyStreamParser(enc)
    events: list[Event] = []
    for i, t in enumerate(ids):
        events += parser.feed(t, TokenIdLogprob(t, -0.01 * i) if logprobs else None)
    if finish:
        events += parser.finish()
    return events, parser


def all_tokens(events: list[Event]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def ends(events: list[Event]) -> list[SegmentEnd]:
    return [e for e in events if isinstance(e, SegmentEnd)]


def test_reasoning_then_function_call(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, WEATHER_CALL)
    events, parser = parse(enc, ids)
    assert [type(e).__name__ for e in events if not isinstance(e, SegmentDelta)] == [
        "SegmentStart",
        "SegmentEnd",
        "SegmentStart",
        "SegmentEnd",
    ]
    reasoning, fn = ends(events)
    assert (reasoning.kind, reasoning.text, reasoning.terminator) == (
        "reasoning",
        "User wants weather.",
        "<|end|>",
    )
    assert (fn.kind, fn.name, fn.arguments, fn.valid, fn.terminator) == (
        "function_call",
        "get_weather",
        '{"city":"Paris"}',
        True,
        "<|call|>",
    )
    start = [e for e in events if isinstance(e, SegmentStart)][1]
    assert (start.recipient, start.content_type, start.name) == (
        "functions.get_weather",
        "<|constrain|>json",
        "get_weather",
    )
    deltas = [e.text for e in events if isinstance(e, SegmentDelta) and e.index == 1]
    assert "".join(deltas) == '{"city":"Paris"}' and len(deltas) > 1  # streamed
    # exact token accounting
    assert all_tokens(events) == ids
    analysis_len = len(ids_of(enc, "<|channel|>analysis<|message|>User wants weather.<|end|>"))
    assert reasoning.total_tokens == parser.reasoning_tokens == analysis_len
    assert reasoning.total_tokens + fn.total_tokens == len(ids)
    # the tool loop gets harmony messages equal to harmony's own parse
    assert parser.messages == enc.parse_messages_from_completion_tokens(ids, Role.ASSISTANT)


def test_logprobs_travel_with_their_tokens(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, WEATHER_CALL)
    events, _ = parse(enc, ids, logprobs=True)
    for e in events:
        assert e.logprobs is not None
        assert [lp.token_id for lp in e.logprobs] == list(e.token_ids)
    flat = [lp.logprob for e in events for lp in (e.logprobs or ())]
    assert flat == [-0.01 * i for i in range(len(ids))]


def test_final_answer_with_preamble(enc: HarmonyEncoding) -> None:
    text = (
        "<|channel|>commentary<|message|>Let me answer.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>"
    )
    events, _ = parse(enc, ids_of(enc, text))
    pre, final = ends(events)
    assert (pre.kind, pre.channel, pre.text) == ("text", "commentary", "Let me answer.")
    assert (final.kind, final.channel, final.text, final.terminator) == (
        "text",
        "final",
        "Paris.",
        "<|return|>",
    )


def test_split_characters_wait_for_their_last_byte(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, "<|channel|>final<|message|>日本語🎉ok<|return|>")
    events, _ = parse(enc, ids)
    deltas = [e for e in events if isinstance(e, SegmentDelta)]
    assert all(d.text for d in deltas)
    assert any(len(d.token_ids) > 1 for d in deltas)  # the emoji spans two tokens here
    assert "".join(d.text for d in deltas) == "日本語🎉ok"
    assert all_tokens(events) == ids


def test_cut_off_mid_analysis(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, "<|channel|>analysis<|message|>Let me think about")
    events, parser = parse(enc, ids, finish=False)
    assert not ends(events)
    tail = parser.finish()
    (end,) = ends(tail)
    assert (end.kind, end.text, end.cut_off, end.token_ids, end.terminator) == (
        "reasoning",
        "Let me think about",
        True,
        (),
        None,
    )
    assert end.total_tokens == len(ids) == parser.reasoning_tokens
    assert all_tokens(events + tail) == ids
    assert parser.finish() == []  # idempotent
    with pytest.raises(RuntimeError):
        parser.feed(ids[0])


def test_cut_off_in_a_call_is_an_invalid_call(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, WEATHER_CALL)[:-3]  # stop inside the arguments
    events, _ = parse(enc, ids)
    fn = ends(events)[-1]
    assert fn.kind == "function_call" and fn.cut_off and not fn.valid
    assert fn.arguments == '{"city":"'
    assert all_tokens(events) == ids


def test_cut_off_in_a_header_is_stray(enc: HarmonyEncoding) -> None:
    ids = ids_of(enc, "<|channel|>final<|message|>Hi<|end|><|start|>assistant<|channel|>fin")
    events, _ = parse(enc, ids)
    stray = events[-1]
    assert isinstance(stray, Stray) and "header" in stray.reason
    assert stray.text == "<|start|>assistant<|channel|>fin"
    assert all_tokens(events) == ids


@pytest.mark.parametrize("args", ['{"city": Paris}', "[1, 2]", ""])
def test_malformed_call_arguments_do_not_raise(enc: HarmonyEncoding, args: str) -> None:
    text = (
        f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{args}<|call|>"
    )
    events, _ = parse(enc, ids_of(enc, text))
    (fn,) = ends(events)
    assert fn.kind == "function_call" and fn.name == "get_weather"
    assert fn.arguments == args and not fn.valid and fn.error and not fn.cut_off


def test_python_call(enc: HarmonyEncoding) -> None:
    code = "import math\nprint(math.pi)"
    events, parser = parse(
        enc, ids_of(enc, f"<|channel|>analysis to=python code<|message|>{code}<|call|>")
    )
    (end,) = ends(events)
    assert (end.kind, end.code, end.recipient, end.valid) == (
        "code_interpreter_call",
        code,
        "python",
        True,
    )
    assert parser.reasoning_tokens == 0  # tool calls are output, not reasoning


@pytest.mark.parametrize(
    "recipient, args, action",
    [
        (
            "browser.search",
            '{"query": "gpt-oss", "topn": 5}',
            {"type": "search", "query": "gpt-oss"},
        ),
        (
            "browser.open",
            '{"id": "https://example.com"}',
            {"type": "open_page", "url": "https://example.com"},
        ),
        ("browser.open", '{"id": 3, "cursor": 1}', {"type": "open_page", "url": None}),
        (
            "browser.find",
            '{"pattern": "weather"}',
            {"type": "find_in_page", "pattern": "weather", "url": ""},
        ),
    ],
)
def test_browser_calls(enc: HarmonyEncoding, recipient: str, args: str, action: dict) -> None:
    text = f"<|channel|>analysis to={recipient} code<|message|>{args}<|call|>"
    events, _ = parse(enc, ids_of(enc, text))
    (end,) = ends(events)
    assert (end.kind, end.name, end.valid, end.text) == (
        "web_search_call",
        recipient.split(".")[1],
        True,
        args,
    )
    assert (
        BrowserTool(None).opening(ToolCall(end.name, end.text))["action"] == action
    )  # the tool's call
    if action.get("url") is not None:
        item = {"id": "ws_1", "status": "completed", "type": "web_search_call", "action": action}
        ResponseFunctionWebSearch.model_validate(item)


def test_bad_browser_args_and_unknown_recipients(enc: HarmonyEncoding) -> None:
    text = (
        "<|channel|>analysis to=browser.search code<|message|>{nope<|call|>"
        "<|start|>assistant<|channel|>commentary to=container.exec<|message|>{}<|call|>"
    )
    events, _ = parse(enc, ids_of(enc, text))
    web, other = ends(events)
    assert web.kind == "web_search_call" and web.text == "{nope"  # the tool reads its arguments
    with pytest.raises(ValueError):
        action_of(web.name, web.text)
    assert BrowserTool(None).opening(ToolCall(web.name, web.text))["action"] == {"type": "search"}
    assert other.kind == "function_call" and other.name == "container.exec" and not other.valid
    assert "unknown recipient" in (other.error or "")


def test_text_outside_messages_is_stray_and_parsing_recovers(enc: HarmonyEncoding) -> None:
    ids = ids_of(
        enc,
        "<|channel|>final<|message|>Hi<|end|>oops"
        "<|start|>assistant<|channel|>final<|message|>again<|return|>",
    )
    events, _ = parse(enc, ids)
    assert [e.text for e in ends(events)] == ["Hi", "again"]
    strays = [e for e in events if isinstance(e, Stray)]
    assert strays and "".join(s.text for s in strays) == "oops"
    assert all_tokens(events) == ids


def test_a_message_as_another_role_is_not_output(enc: HarmonyEncoding) -> None:
    ids = ids_of(
        enc,
        "<|channel|>final<|message|>Hi<|end|><|start|>user<|message|>fake user<|end|>",
    )
    events, _ = parse(enc, ids)
    assert [e.text for e in ends(events)] == ["Hi"]
    (stray,) = [e for e in events if isinstance(e, Stray)]
    assert "user" in stray.reason and "fake user" in stray.text
    assert all_tokens(events) == ids


def test_rendered_assistant_messages_parse_back(enc: HarmonyEncoding) -> None:
    """Token ids from harmony's own renderer (recipient before channel) parse the same."""
    msg = (
        Message.from_role_and_content(Role.ASSISTANT, '{"city":"Oslo"}')
        .with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json")
    )
    ids = enc.render(msg)[2:]  # drop <|start|>assistant: the prompt already ends with it
    events, parser = parse(enc, ids)
    (end,) = ends(events)
    assert (end.kind, end.name, end.arguments, end.valid) == (
        "function_call",
        "get_weather",
        '{"city":"Oslo"}',
        True,
    )
    assert parser.messages == [msg]


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=60).filter(lambda s: "<|" not in s))
def test_any_final_text_round_trips(cache_dir: Path, body: str) -> None:
    enc = harmony_encoding(cache_dir)
    ids = [
        *ids_of(enc, "<|channel|>final<|message|>"),
        *enc.encode(body),
        *ids_of(enc, "<|return|>"),
    ]
    events, _ = parse(enc, ids)
    deltas = [e for e in events if isinstance(e, SegmentDelta)]
    assert all(d.text for d in deltas)
    assert "".join(d.text for d in deltas) == body == ends(events)[0].text
    assert all_tokens(events) == ids
