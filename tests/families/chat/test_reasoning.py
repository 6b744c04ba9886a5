"""Reasoning in the chat-template family: Qwen3, SmolLM3, DeepSeek-R1-distill and templates
without reasoning, with templates written for the tests (``helpers.chat_templates``).

Rendering per ``reasoning.effort``, parsing of streamed output split at every token boundary
(tags split into several tokens and tags that are one token each), the Responses events and
objects, ``reasoning_tokens``, earlier turns' reasoning, and the 400s.
"""

from __future__ import annotations

import json

import openai
import pytest
from helpers.chat_templates import EFFORT, QWEN3, R1_BARE, R1_OPEN, SMOLLM3, Templated
from helpers.responses import (
    CALL,
    EOS,
    WEATHER,
    check_stream,
    client_for,
    dumps,
    fold,
    ids,
    prompt_text,
    stream_events,
)
from openai.types.responses import Response

from nbresponses.families.chat.family import ChatFamily
from nbresponses.families.chat.parser import Delta, End, Start, StreamParser
from nbresponses.families.chat.template import render, tool_schema
from nbresponses.families.text import IncrementalDetokenizer
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.tokens.scripted import Script, ScriptedTokenSource

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def whole_tags(tokenizer_dir):
    """The tokenizer with ``<think>`` and ``</think>`` as single (non-special) tokens, as in
    Qwen3's and the R1 distills' vocabularies."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_tokens(["<think>", "</think>"])
    return tok


@pytest.fixture(scope="module")
def special_tags(tokenizer_dir):
    """The tokenizer with the tags as *special* tokens (some conversions mark them so)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return tok


@pytest.fixture(params=["split", "whole"])
def tok(request, tokenizer, whole_tags):
    """Both vocabularies: tags split across tokens ("<", "think", ">") and tags as one token."""
    return tokenizer if request.param == "split" else whole_tags


# -- rendering -------------------------------------------------------------------------------


@pytest.mark.parametrize("effort", [None, *EFFORTS])
def test_qwen3_enable_thinking_per_effort(tok, effort):
    p = render(Templated(tok, QWEN3), HI, reasoning_effort=effort)
    if effort in ("none", "minimal"):
        assert p.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert p.start == "closed"
    else:  # on (the default): the model opens <think> itself
        assert p.text.endswith("<|im_start|>assistant\n")
        assert p.start == "free"
    assert p.prefill == p.lead == ""
    assert tok.decode(p.ids) == p.text


@pytest.mark.parametrize("effort", [None, *EFFORTS])
def test_smollm3_reasoning_mode_per_effort(tokenizer, effort):
    p = render(Templated(tokenizer, SMOLLM3), HI, reasoning_effort=effort)
    if effort in ("none", "minimal"):
        assert "Reasoning Mode: /no_think" in p.text and p.start == "closed"
        assert p.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    else:
        assert "Reasoning Mode: /think" in p.text and p.start == "free"
        assert p.text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("flag", "effort", "start"),
    [
        ("/think", None, "free"),
        ("/think", "high", "free"),
        ("/no_think", None, "closed"),
        ("/no_think", "none", "closed"),
        ("/no_think", "minimal", "closed"),
    ],
)
def test_smollm3_system_flags_agreeing_with_the_effort(tokenizer, flag, effort, start):
    msgs = [{"role": "system", "content": f"Be brief. {flag}"}, *HI]
    p = render(Templated(tokenizer, SMOLLM3), msgs, reasoning_effort=effort)
    assert p.start == start
    custom = p.text.split("## Custom Instructions\n\n")[1]
    assert custom.startswith("Be brief.\n\n") and flag not in custom  # the flag is removed


@pytest.mark.parametrize(("flag", "effort"), [("/think", "none"), ("/no_think", "high")])
def test_smollm3_system_flag_against_the_effort_is_a_400(tokenizer, flag, effort):
    msgs = [{"role": "system", "content": f"{flag} Be brief."}, *HI]
    with pytest.raises(openai.BadRequestError) as err:
        render(Templated(tokenizer, SMOLLM3), msgs, reasoning_effort=effort)
    assert err.value.param == "reasoning.effort" and err.value.code == "unsupported_parameter"
    assert "/no_think" in err.value.message


@pytest.mark.parametrize("effort", [None, "low", "medium", "high", "xhigh"])
def test_r1_open_prompt_starts_inside_the_reasoning(tok, effort):
    p = render(Templated(tok, R1_OPEN), HI, reasoning_effort=effort)
    assert p.text.endswith("<|Assistant|><think>\n")
    assert p.start == "open" and p.prefill == p.lead == "<think>\n"


@pytest.mark.parametrize("effort", [None, "low", "high"])
def test_r1_bare_prompt_leaves_an_untagged_start(tok, effort):
    p = render(Templated(tok, R1_BARE), HI, reasoning_effort=effort)
    assert p.text.endswith("<|Assistant|>")
    assert p.start == "implicit" and p.prefill == "" and p.lead == "<think>"


@pytest.mark.parametrize("template", [R1_OPEN, R1_BARE])
@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_always_reasoning_template_refuses_no_reasoning(tokenizer, template, effort):
    with pytest.raises(openai.BadRequestError) as err:
        render(Templated(tokenizer, template), HI, reasoning_effort=effort)
    assert err.value.param == "reasoning.effort" and "always reasons" in err.value.message


@pytest.mark.parametrize("effort", EFFORTS)
def test_template_without_reasoning_refuses_every_effort(tokenizer, effort):
    with pytest.raises(openai.BadRequestError) as err:
        render(tokenizer, HI, reasoning_effort=effort)  # the bundled SmolLM2 template
    assert err.value.param == "reasoning.effort" and err.value.code == "unsupported_parameter"
    assert render(tokenizer, HI).start == "free"


def test_reasoning_effort_variable_gets_the_value(tokenizer):
    tok = Templated(tokenizer, EFFORT)
    assert "Reasoning: medium\n<think>" in render(tok, HI).text  # the template's default
    for effort in ("low", "medium", "high"):
        p = render(tok, HI, reasoning_effort=effort)
        assert p.text.endswith(f"Reasoning: {effort}\n<think>") and p.start == "open"
    with pytest.raises(openai.BadRequestError) as err:
        render(tok, HI, reasoning_effort="none")
    assert err.value.param == "reasoning.effort"
    assert "reasoning_effort must be low, medium or high" in err.value.message


def test_forced_call_skips_the_reasoning(tokenizer):
    tools = [tool_schema("get_weather", None, None)]
    for template in (R1_OPEN, R1_BARE, QWEN3):
        p = render(Templated(tokenizer, template), HI, tools=tools, tool_mode="required")
        assert p.prefill == p.lead == "<tool_call>\n" and p.start == "closed"
    p = render(Templated(tokenizer, R1_OPEN), HI, tools=tools, tool_mode="required")
    assert p.text.endswith("<think>\n\n</think>\n\n<tool_call>\n")


# -- parsing: every token boundary ------------------------------------------------------------

# (template, the model's output, the (kind, text) items the parser must read from it)
OUTPUTS = [
    (
        QWEN3,
        "<think>\nThe user greets me. 🤔\n</think>\n\nHello! How can I help?",
        [("reasoning", "The user greets me. 🤔"), ("text", "Hello! How can I help?")],
    ),
    (
        QWEN3,
        "<think>\nI need the weather.\n</think>\n\n" + CALL,
        [("reasoning", "I need the weather."), ("tool_call", '{"city": "Zürich"}')],
    ),
    (
        QWEN3,
        "Let me check. <think>hmm, 日本</think> It is 42.",
        [("text", "Let me check."), ("reasoning", "hmm, 日本"), ("text", " It is 42.")],
    ),
    (
        SMOLLM3,
        "<think>\nA greeting.\n</think>\nHi! " + CALL,
        [("reasoning", "A greeting."), ("text", "Hi!"), ("tool_call", '{"city": "Zürich"}')],
    ),
    (
        R1_OPEN,
        "Okay, the user says hi.\n</think>\n\nHello!",
        [("reasoning", "Okay, the user says hi."), ("text", "Hello!")],
    ),
    (  # the model writes the opener the prompt already has: still one block
        R1_OPEN,
        "<think>\nOkay.\n</think>\n\nHello!",
        [("reasoning", "Okay."), ("text", "Hello!")],
    ),
    (
        R1_BARE,
        "Okay, so 2+2 is 4.\n</think>\n\n**4**",
        [("reasoning", "Okay, so 2+2 is 4."), ("text", "**4**")],
    ),
    (  # what the first R1 distills often wrote after this template
        R1_BARE,
        "<think>\nOkay, so 2+2 is 4.\n</think>\n\n**4**",
        [("reasoning", "Okay, so 2+2 is 4."), ("text", "**4**")],
    ),
    (R1_BARE, "<think>\n\n</think>\n\n4", [("reasoning", ""), ("text", "4")]),
    (R1_BARE, "Okay, let me think about <b>", [("reasoning", "Okay, let me think about <b>")]),
]


def items(events) -> list[tuple[str, str]]:
    """(kind, joined deltas) per item, checking that every item starts and ends once."""
    out: list[tuple[str, str]] = []
    open_kind = None
    for e in events:
        if isinstance(e, Start):
            assert open_kind is None
            open_kind = e.kind
            out.append((e.kind, ""))
        elif isinstance(e, Delta):
            assert e.kind == open_kind
            out[-1] = (e.kind, out[-1][1] + e.text)
        else:
            assert isinstance(e, End) and e.kind == open_kind
            open_kind = None
    assert open_kind is None
    return out


def parse(tok, ids, lead: str, cut: int | None = None):
    """Detokenize ``ids`` and parse the text, one feed per token (``cut``: in two feeds, split
    before token ``cut``)."""
    detok = IncrementalDetokenizer(tok)
    parser = StreamParser(tools=True, prefill=lead)
    events, pending = [], ""
    for i, t in enumerate(ids):
        if cut is not None and i == cut:
            events += parser.feed(pending)
            pending = ""
        pending += detok.push(t)
        if cut is None and pending:
            events += parser.feed(pending)
            pending = ""
    events += parser.feed(pending + detok.flush())
    return events + parser.finish()


def visible(s: str) -> str:
    """Text without tags, tool-call wrappers or whitespace: what no parse may lose or repeat."""
    for tag in ("<think>", "</think>"):
        s = s.replace(tag, "")
    s = s.replace(CALL, '{"city": "Zürich"}')
    return "".join(s.split())


@pytest.mark.parametrize(("template", "output", "expected"), OUTPUTS)
def test_parse_at_every_token_boundary(tok, template, output, expected):
    lead = render(Templated(tok, template), HI).lead
    ids = tok.encode(output)
    pieces = tok.convert_ids_to_tokens(ids)
    if "</think>" in output:  # the tags really are one token each, or really split
        whole = "</think>" in tok.get_vocab()
        assert ("</think>" in pieces) == whole and ("think" in pieces) != whole
    token_by_token = items(parse(tok, ids, lead))
    assert token_by_token == expected
    joined = "".join(text for _, text in token_by_token)
    assert visible(joined) == visible(output)  # nothing lost, nothing twice
    for cut in range(len(ids) + 1):
        two = items(parse(tok, ids, lead, cut))
        assert [(k, t.strip()) for k, t in two] == [(k, t.strip()) for k, t in expected]


# -- through the Responses API -----------------------------------------------------------------


def client(tok, template, *outputs, **kw):
    """A scripted client whose model has ``template``; each output is a list of text pieces
    encoded one by one (so a test knows exactly which tokens each piece is)."""
    scripts = [
        Script([t for piece in pieces for t in tok.encode(piece)] + [EOS], **kw)
        for pieces in outputs
    ]
    source = ScriptedTokenSource(scripts, eos_token_ids=(EOS,))
    model = tok if template is None else Templated(tok, template)
    return AsyncResponsesClient(source, model, model="test"), source


@pytest.mark.parametrize(
    ("template", "reasoning", "answer", "end"),
    [
        (QWEN3, "<think>\nThe user greets me. 🤔\n</think>", "\n\nHello!", "assistant\n"),
        (SMOLLM3, "<think>\nA greeting.\n</think>", "\nHello!", "assistant\n"),
        (R1_OPEN, "Okay, the user says hi.\n</think>", "\n\nHello!", "<|Assistant|><think>\n"),
        (R1_BARE, "Okay, the user says hi.\n</think>", "\n\nHello!", "<|Assistant|>"),
        (R1_BARE, "<think>\nOkay, the user says hi.\n</think>", "\n\nHello!", "<|Assistant|>"),
    ],
)
async def test_reasoning_events_items_and_tokens(tok, template, reasoning, answer, end):
    c, source = client(tok, template, [reasoning, answer], logprobs=[-0.5] * 64)
    events = await stream_events(
        c, input="hi", include=["message.output_text.logprobs"], top_logprobs=2
    )
    check_stream(events)  # every event validates as an openai ResponseStreamEvent
    assert prompt_text(tok, source).endswith(end)
    r = events[-1].response
    assert Response.model_validate(r.model_dump(mode="json")) == r
    assert [i.type for i in r.output] == ["reasoning", "message"]
    thought = reasoning.replace("<think>", "").replace("</think>", "").strip()
    assert r.output[0].content[0].text == thought and r.output[0].status == "completed"
    assert [e.type for e in events if "reasoning" in e.type] == [
        *(["response.reasoning_text.delta"] * len(
            [e for e in events if e.type == "response.reasoning_text.delta"])),
        "response.reasoning_text.done",
    ]  # fmt: skip
    assert r.output_text == "Hello!"
    assert r.usage.output_tokens_details.reasoning_tokens == len(tok.encode(reasoning))
    assert r.usage.output_tokens == len(tok.encode(reasoning)) + len(tok.encode(answer)) + 1
    text_lps = r.output[1].content[0].logprobs
    assert "".join(lp.token for lp in text_lps) == "Hello!"
    assert dumps(fold(events).output) == dumps(r.output)


async def test_thinking_off_answers_without_reasoning(tok):
    c, source = client(tok, QWEN3, ["Hello there."])
    r = await c.responses.create(input="hi", reasoning={"effort": "none"})
    assert prompt_text(tok, source).endswith("assistant\n<think>\n\n</think>\n\n")
    assert [i.type for i in r.output] == ["message"] and r.output_text == "Hello there."
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.reasoning.effort == "none"


async def test_r1_reasoning_cut_by_max_tokens_is_incomplete(tok):
    c, _ = client(tok, R1_BARE, ["Okay, let me think about this for a long while", "</think>x"])
    events = await stream_events(c, input="hi", max_output_tokens=5)
    check_stream(events)
    r = events[-1].response
    assert r.status == "incomplete" and [i.type for i in r.output] == ["reasoning"]
    assert r.output[0].status == "incomplete"
    assert r.usage.output_tokens == 5 == r.usage.output_tokens_details.reasoning_tokens


async def test_reasoning_then_tool_call(tok):
    c, _ = client(tok, QWEN3, ["<think>\nI need the weather.\n</think>", "\n\n" + CALL])
    events = await stream_events(c, input="Weather?", tools=[WEATHER])
    check_stream(events)
    r = events[-1].response
    assert [i.type for i in r.output] == ["reasoning", "function_call"]
    assert json.loads(r.output[1].arguments) == {"city": "Zürich"}
    assert r.usage.output_tokens_details.reasoning_tokens == len(
        tok.encode("<think>\nI need the weather.\n</think>")
    )


async def test_special_think_tokens_are_still_read(special_tags):
    reasoning = "<think>\nHmm.\n</think>"
    c, _ = client(special_tags, QWEN3, [reasoning, "\n\nHi."])
    family = c.family
    assert isinstance(family, ChatFamily) and family._keep_special
    r = await c.responses.create(input="hi")
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Hmm." and r.output_text == "Hi."
    assert r.usage.output_tokens_details.reasoning_tokens == len(special_tags.encode(reasoning))


@pytest.mark.parametrize("template", [R1_OPEN, R1_BARE])
async def test_grammar_lets_the_reasoning_come_first(tok, template):
    """The grammar of a model that starts inside its reasoning (opened by the prompt, or
    untagged) admits the reasoning, then holds the answer or call (the scripted source refuses
    any token the grammar masks)."""
    c, _ = client(
        tok,
        template,
        ["Okay, JSON it is.\n</think>", '\n\n{"a": 1}'],
        ["Okay, a call.\n</think>", "\n\n" + CALL],
    )
    r = await c.responses.create(input="hi", text={"format": {"type": "json_object"}})
    assert r.status == "completed", r.error
    assert json.loads(r.output_text) == {"a": 1} and r.output[0].type == "reasoning"
    r = await c.responses.create(input="hi", tools=[WEATHER])
    assert r.status == "completed", r.error
    assert [i.type for i in r.output] == ["reasoning", "function_call"]


async def test_grammar_admits_a_think_block_the_model_opens(tok):
    """Qwen3 with thinking on writes <think> itself: a JSON format still lets it think first
    (or not); with thinking off the answer is JSON from the first token."""
    thought = ["<think>\nJSON.\n</think>", '\n\n{"a": 1}']
    c, _ = client(tok, QWEN3, thought, ['{"a": 1}'], thought)
    fmt = {"format": {"type": "json_object"}}
    r = await c.responses.create(input="hi", text=fmt)
    assert r.status == "completed", r.error
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert json.loads(r.output_text) == {"a": 1}
    r = await c.responses.create(input="hi", text=fmt)
    assert r.status == "completed" and [i.type for i in r.output] == ["message"]
    r = await c.responses.create(input="hi", text=fmt, reasoning={"effort": "none"})
    assert r.status == "failed" and "grammar refuses" in r.error.message


# -- earlier turns -----------------------------------------------------------------------------


async def test_qwen3_keeps_reasoning_only_in_the_current_tool_loop(tokenizer):
    c, source = client(
        tokenizer,
        QWEN3,
        ["<think>\nI need the weather.\n</think>", "\n\n" + CALL],
        ["<think>\nIt is sunny.\n</think>", "\n\nSunny in Zürich."],
        ["<think>\nThanks.\n</think>", "\n\nYou are welcome."],
    )
    first = await c.responses.create(input="Weather in Zürich?", tools=[WEATHER])
    call = first.output[1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = await c.responses.create(
        input=[output], previous_response_id=first.id, tools=[WEATHER]
    )
    prompt = prompt_text(tokenizer, source)
    assert "<think>\nI need the weather.\n</think>\n\n<tool_call>" in prompt  # this loop's
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    await c.responses.create(input="Thanks!", previous_response_id=second.id)
    prompt = prompt_text(tokenizer, source)
    assert "I need the weather." not in prompt and "It is sunny." not in prompt  # before
    assert "Sunny in Zürich.<|im_end|>" in prompt  # the query: dropped, answers kept


@pytest.mark.parametrize("template", [SMOLLM3, R1_OPEN, R1_BARE])
async def test_other_templates_drop_earlier_reasoning(tokenizer, template):
    c, source = client(
        tokenizer, template, ["<think>\nSecret thought.\n</think>", "\n\nHello!"], ["Bye."]
    )
    first = await c.responses.create(input="hi")
    assert first.output[0].content[0].text == "Secret thought."
    await c.responses.create(input="bye", previous_response_id=first.id)
    prompt = prompt_text(tokenizer, source)
    assert "Secret thought." not in prompt and "Hello!" in prompt


async def test_smollm3_sees_its_earlier_calls(tokenizer):
    """SmolLM3's template takes tools but does not render past tool_calls: they are written
    into the assistant turn as the blocks the model wrote."""
    c, source = client(tokenizer, SMOLLM3, ["<think>\nCheck.\n</think>", "\n" + CALL], ["Sunny."])
    first = await c.responses.create(input="Weather?", tools=[WEATHER])
    output = {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "ok"}
    await c.responses.create(input=[output], previous_response_id=first.id, tools=[WEATHER])
    prompt = prompt_text(tokenizer, source)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ' in prompt
    assert "<|im_start|>user\nok<|im_end|>" in prompt


# -- 400s through the client -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "effort", "instructions"),
    [
        (None, "low", None),  # the bundled SmolLM2 template: no reasoning
        (None, "none", None),
        (R1_OPEN, "none", None),
        (R1_BARE, "minimal", None),
        (SMOLLM3, "none", "Be brief. /think"),
        (SMOLLM3, "high", "/no_think"),
        (EFFORT, "minimal", None),
    ],
)
async def test_effort_a_template_cannot_honour_is_a_400(tokenizer, template, effort, instructions):
    c, source = client(tokenizer, template, ["x"])
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(input="q", instructions=instructions, reasoning={"effort": effort})
    assert err.value.status_code == 400
    assert err.value.param == "reasoning.effort" and err.value.code == "unsupported_parameter"
    assert err.value.body["type"] == "invalid_request_error"
    assert source.prompts == []  # refused before anything ran


# -- SmolLM2's template (no reasoning of its own): <think> written anyway ---------------------


async def test_reasoning_items_and_exact_token_count(tokenizer):
    thought = "<think>hmm, 日本 is 🤔</think>"
    c, _ = client_for(tokenizer, thought + "\n\nAnswer")
    events = await stream_events(c, input="q")
    check_stream(events)
    r = events[-1].response
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].id.startswith("rs_")
    assert r.output[0].content[0].text == "hmm, 日本 is 🤔"
    assert r.output_text == "Answer"
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == "hmm, 日本 is 🤔"
    expected = len(tokenizer.encode(thought))
    assert tokenizer.encode(thought) == tokenizer.encode(thought + "\n\nAnswer")[:expected]
    assert r.usage.output_tokens_details.reasoning_tokens == expected
    assert r.usage.output_tokens == len(ids(tokenizer, thought + "\n\nAnswer"))
    assert dumps(fold(events).output) == dumps(r.output)


async def test_truncated_reasoning_is_incomplete(tokenizer):
    c, _ = client_for(tokenizer, "<think>a long long thought that goes on</think>Hi")
    events = await stream_events(c, input="q", max_output_tokens=6)
    check_stream(events)
    r = events[-1].response
    assert events[-1].type == "response.incomplete"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "reasoning" and r.output[0].status == "incomplete"
    assert r.usage.output_tokens == 6 == r.usage.output_tokens_details.reasoning_tokens


async def test_reasoning_effort_needs_template_support(tokenizer):
    c, _ = client_for(tokenizer, "x")
    with pytest.raises(openai.BadRequestError) as err:
        await c.responses.create(input="q", reasoning={"effort": "low"})
    assert err.value.param == "reasoning.effort"
