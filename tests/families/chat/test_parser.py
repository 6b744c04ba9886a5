"""The chat family's streaming parser: reasoning tags, Hermes tool calls, any chunking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbresponses.families.chat.parser import Delta, End, Start, StreamParser
from nbresponses.families.text import IncrementalDetokenizer


def segments(events):
    """Joined deltas per kind, plus the (kind, Start/End) skeleton."""
    text = {"text": [], "reasoning": [], "tool_call": []}
    skeleton = []
    for e in events:
        if isinstance(e, Delta):
            text[e.kind].append(e.text)
        else:
            skeleton.append((type(e).__name__, e.kind))
    return {k: "".join(v) for k, v in text.items()}, skeleton


def parse_tokens(tokenizer, s, **kw):
    """Drive the parser the way a run does: token by token through the detokenizer."""
    detok = IncrementalDetokenizer(tokenizer)
    parser = StreamParser(**kw)
    events = []
    for t in tokenizer.encode(s):
        piece = detok.push(t)
        if piece:
            events += parser.feed(piece)
    events += parser.feed(detok.flush())
    return events + parser.finish()


def test_reasoning_split_tags(tokenizer):
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("<think>hmm</think>Answer"))
    assert pieces[:3] == ["<", "think", ">"]  # the tags really are split across tokens
    events = parse_tokens(tokenizer, "<think>hmm</think>Answer")
    text, skeleton = segments(events)
    assert text == {"text": "Answer", "reasoning": "hmm", "tool_call": ""}
    assert skeleton == [
        ("Start", "reasoning"), ("End", "reasoning"), ("Start", "text"), ("End", "text")
    ]  # fmt: skip


def test_prefilled_think(tokenizer):
    events = StreamParser(prefill="<think>\n").feed("a b") + StreamParser().finish()
    assert isinstance(events[0], Start) and events[0].kind == "reasoning"


def test_tool_calls_stream_arguments(tokenizer):
    s = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", '
        '"days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
        "</tool_call>"
    )
    events = parse_tokens(tokenizer, s, tools=True)
    starts = [e for e in events if isinstance(e, Start)]
    assert [(e.kind, e.name) for e in starts] == [
        ("text", ""), ("tool_call", "get_weather"), ("tool_call", "get_time")
    ]  # fmt: skip
    ends = [e for e in events if isinstance(e, End) and e.kind == "tool_call"]
    assert [json.loads(e.arguments) for e in ends] == [{"city": "Zürich", "days": [1, 2]}, {}]
    assert all(e.valid for e in ends)
    first_args = [e for e in events if isinstance(e, Delta) and e.kind == "tool_call"]
    assert len(first_args) > 2  # streamed, not in one piece
    assert segments(events)[0]["text"] == "Let me check."


def test_tool_tags_are_text_without_tools(tokenizer):
    s = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    text, _ = segments(parse_tokens(tokenizer, s, tools=False))
    assert text["text"] == s


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["f"]</tool_call>',
    ],
)
def test_invalid_call_before_streaming_becomes_text(tokenizer, block):
    text, skeleton = segments(parse_tokens(tokenizer, f"Hi {block} bye", tools=True))
    assert text["text"] == f"Hi {block} bye"
    assert ("Start", "tool_call") not in skeleton


def test_invalid_arguments_after_streaming_end_invalid(tokenizer):
    s = '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>after'
    events = parse_tokens(tokenizer, s, tools=True)
    end = next(e for e in events if isinstance(e, End) and e.kind == "tool_call")
    assert not end.valid and end.arguments == '{"a": 1'
    assert segments(events)[0]["text"] == "after"


def test_call_without_closing_tag_at_eos(tokenizer):
    events = parse_tokens(
        tokenizer, '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n', tools=True
    )
    end = next(e for e in events if isinstance(e, End) and e.kind == "tool_call")
    assert end.valid and json.loads(end.arguments) == {"x": 1}


TEXTS = st.sampled_from(
    [
        "<think>a\nb</think>\n\nc",
        'x<tool_call>{"name": "n", "arguments": {"k": "v}"}}</tool_call>y',
        "<tool_call>{oops</tool_call>",
        "plain 日本 text < not a tag",
        '<think></think><tool_call>{"arguments": {}, "name": "m"}</tool_call>',
    ]
)


@settings(max_examples=150, deadline=None)
@given(TEXTS, st.lists(st.integers(1, 7), min_size=1, max_size=40))
def test_any_chunking_gives_the_same_segments(s, cuts):
    """Where chunks fall never changes what the parser reads (apart from whitespace trim)."""
    chunks, i = [], 0
    for c in cuts:
        chunks.append(s[i : i + c])
        i += c
    chunks.append(s[i:])
    parser = StreamParser(tools=True)
    events = [e for c in chunks for e in parser.feed(c)] + parser.finish()
    whole = StreamParser(tools=True)
    expected = whole.feed(s) + whole.finish()
    a, b = segments(events), segments(expected)
    assert a[1] == b[1]
    assert a[0]["reasoning"].strip() == b[0]["reasoning"].strip()
    assert a[0]["tool_call"] == b[0]["tool_call"]
    assert a[0]["text"].strip() == b[0]["text"].strip()
    ends = [e.end for e in events]
    assert ends == sorted(ends) or any(not isinstance(e, Delta) for e in events)


def test_a_forced_call_cut_before_its_arguments_leaves_nothing():
    """The prompt opened the call (a forced tool_choice) and nothing of it came: the prompt's
    text is not the model's answer, so no text and no call come out."""
    for prefill in ("<tool_call>\n", '<tool_call>\n{"name": "get_weather", "arguments": '):
        parser = StreamParser(tools=True, prefill=prefill)
        assert parser.finish() == []
        parser = StreamParser(tools=True, prefill=prefill)
        assert parser.feed('{"na' if prefill.endswith("\n") else "") + parser.finish() == []
