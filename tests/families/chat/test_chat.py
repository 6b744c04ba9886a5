"""formats: detokenizer, token bytes, the streaming parser, chat rendering, the scripted source."""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers.chat_templates import Templated
from hypothesis import given, settings
from hypothesis import strategies as st

from nbresponses.families.chat.parser import Delta, End, Start, StreamParser
from nbresponses.families.chat.template import TemplateCapabilities, render, tool_schema
from nbresponses.families.text import IncrementalDetokenizer, TokenBytes
from nbresponses.tokens.contract import SamplingParams
from nbresponses.tokens.scripted import Script, ScriptedTokenSource

SAMPLES = [
    "Hello, world!",
    "Answer é 日本語 🙂 done",
    "<think>hmm, 🤔 let me see</think>\n\nThe answer is 42.",
    'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
]


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


@pytest.mark.parametrize("s", SAMPLES)
def test_detokenizer_whole_characters(tokenizer, s):
    ids = tokenizer.encode(s)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(t) for t in ids]
    assert detok.flush() == ""
    assert "".join(deltas) == s
    assert all("\ufffd" not in d for d in deltas)
    if "日" in s:
        assert "" in deltas  # a character spanning tokens waits for its last byte


@pytest.mark.parametrize("s", SAMPLES)
def test_token_bytes_join_to_text(tokenizer, s):
    tb = TokenBytes(tokenizer)
    raw = b"".join(bytes(tb.get(t)[1]) for t in tokenizer.encode(s))
    assert raw.decode("utf-8") == s


def test_token_string_of_partial_character(tokenizer):
    tb = TokenBytes(tokenizer)
    partial = [tb.get(t) for t in tokenizer.encode("日")]
    assert len(partial) > 1
    assert all(token.startswith("bytes:\\x") for token, _ in partial)


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


def test_render_injects_hermes_tools_for_smollm2(tokenizer):
    assert not TemplateCapabilities.of(tokenizer).tools
    tools = [tool_schema("get_weather", "Weather now.", {"type": "object", "properties": {}})]
    msgs = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]  # fmt: skip
    p = render(tokenizer, msgs, tools=tools)
    assert "<tools>" in p.text and '"name": "get_weather"' in p.text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in p.text
    assert "<tool_response>\nsunny\n</tool_response>" in p.text
    assert p.text.endswith("<|im_start|>assistant\n") and p.prefill == ""
    assert tokenizer.decode(p.ids) == p.text
    assert "<tools>" not in render(tokenizer, msgs, tools=tools, tool_mode="none").text
    forced = render(tokenizer, msgs, tools=tools, forced_tool="get_weather")
    assert forced.text.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert forced.prefill == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert render(tokenizer, msgs, tools=tools, tool_mode="required").prefill == "<tool_call>\n"


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}TOOLS:{{ tools | tojson }}{% endif %}"
    "<|im_start|>assistant\n{% if enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)


def test_native_template_thinking_and_tools(tokenizer):
    tok = Templated(tokenizer, THINKING_TEMPLATE)
    caps = TemplateCapabilities.of(tok)
    assert caps.tools and caps.enable_thinking and caps.effort
    msgs = [{"role": "user", "content": "hi"}]
    p = render(tok, msgs, tools=[tool_schema("f", None, None)])
    assert "TOOLS:" in p.text and p.prefill == "<think>\n"
    assert render(tok, msgs, reasoning_effort="none").prefill == ""
    forced = render(tok, msgs, tools=[tool_schema("f", None, None)], forced_tool="f")
    assert "</think>" in forced.text and forced.prefill.startswith("<tool_call>")


async def collect(source, prompt, params):
    return [s async for s in source.generate(prompt, params)]


async def test_scripted_source_limits_and_logprobs():
    src = ScriptedTokenSource([Script([5, 6, 7, 8], logprobs=[-0.1, -0.2, -0.3, -0.4])])
    steps = await collect(src, [1, 2], SamplingParams(max_tokens=2, logprobs=True, top_logprobs=3))
    assert [s.token_ids for s in steps] == [(5,), (6,)]
    assert steps[-1].finish_reason == "length"
    assert all(len(s.logprobs[0].top) == 3 for s in steps)
    steps = await collect(src, [1], SamplingParams(stop_token_ids=(7,)))
    assert steps[-1].token_ids == (7,) and steps[-1].finish_reason == "stop"
    assert all(s.logprobs is None for s in steps)


async def test_scripted_source_cancellation():
    src = ScriptedTokenSource([Script(list(range(10, 60)), delay=0.01)])

    async def consume():
        async for _ in src.generate([1], SamplingParams(max_tokens=100)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert src.cancelled == 1
