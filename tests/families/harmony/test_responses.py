"""gpt-oss through the Responses API: real harmony token ids replayed by a scripted source.

Each script is what a gpt-oss model would generate after ``<|start|>assistant``, made by
rendering assistant messages with the harmony encoding itself. Every stream passes the same
protocol checks as the chat-template tests (validity, sequence numbers, nesting, SDK fold).
"""

from __future__ import annotations

import asyncio
import json
from datetime import date

import openai
import pytest
from helpers.responses import WEATHER, check_stream, dumps, fold, strip_ids
from helpers.sandbox import needs_bwrap
from openai.types.responses import Response
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
)

from nbresponses.families.chat.family import ChatFamily
from nbresponses.families.harmony import (
    continuation_ids,
)
from nbresponses.families.harmony.family import HarmonyFamily
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.stream import ResponseEventStream
from nbresponses.tokens.scripted import Script, ScriptedTokenSource
from nbresponses.tools import BrowserResult
from nbresponses.tools.base import tool_message

GPT_OSS_EOS = (
    200002,
    199999,
    200012,
)  # <|return|>, <|endoftext|>, <|call|> (its generation_config)
PYTHON = {"type": "code_interpreter", "container": {"type": "auto"}}


# -- scripts: what the model writes, rendered by harmony ---------------------------------------


def msg(text: str, channel: str, recipient: str | None = None, ctype: str | None = None) -> Message:
    m = Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)
    if recipient:
        m = m.with_recipient(recipient)
    if ctype:
        m = m.with_content_type(ctype)
    return m


def analysis(text: str) -> Message:
    return msg(text, "analysis")


def final(text: str) -> Message:
    return msg(text, "final")


def fn_call(name: str, args: str) -> Message:
    return msg(args, "commentary", f"functions.{name}", "<|constrain|>json")


def py_call(code: str) -> Message:
    return msg(code, "analysis", "python", "code")


def browser_call(action: str, args: str) -> Message:
    return msg(args, "analysis", f"browser.{action}", "<|constrain|>json")


def generated(enc: HarmonyEncoding, *messages: Message) -> list[int]:
    """The ids a model generates after ``<|start|>assistant``; a final ends with <|return|>."""
    ids = [t for m in messages for t in enc.render(m)]
    assert ids[:2] == enc.encode("<|start|>assistant", allowed_special="all")
    ids = ids[2:]
    if messages[-1].channel == "final":
        assert enc.decode(ids[-1:]) == "<|end|>"
        ids[-1] = enc.encode("<|return|>", allowed_special="all")[0]
    return ids


def make_client(
    enc: HarmonyEncoding, *scripts: Script | list[int], **kw
) -> tuple[AsyncResponsesClient, ScriptedTokenSource]:
    source = ScriptedTokenSource(
        list(scripts), eos_token_ids=GPT_OSS_EOS, context_length=kw.pop("context_length", 8192)
    )
    options = {k: kw.pop(k) for k in ("browser", "python_timeout", "max_tool_calls") if k in kw}
    if options:  # harmony's own options: given by constructing the family
        kw["family"] = HarmonyFamily(enc, eos_token_ids=GPT_OSS_EOS, **options)
    client = AsyncResponsesClient(
        source, None, model="gpt-oss-tiny", config={"model_type": "gpt_oss"}, **kw
    )
    return client, source


async def stream_events(client: AsyncResponsesClient, **kwargs) -> list:
    stream = await client.responses.create(stream=True, **kwargs)
    assert isinstance(stream, ResponseEventStream)
    async with stream:
        return [e async for e in stream]


def folds_to(events: list) -> Response:
    """Protocol checks; the completed response, which the SDK's fold reproduces."""
    check_stream(events)
    assert events[-1].type == "response.completed"
    done = events[-1].response
    folded = fold(events)
    assert folded.id == done.id and dumps(folded.output) == dumps(done.output)
    assert folded.usage == done.usage
    return done


# -- expected prompts, built with harmony directly ---------------------------------------------


def system(effort: ReasoningEffort = ReasoningEffort.MEDIUM) -> Message:
    content = (
        SystemContent.new()
        .with_reasoning_effort(effort)
        .with_conversation_start_date(date.today().isoformat())
        .with_knowledge_cutoff("2024-06")
    )
    return Message.from_role_and_content(Role.SYSTEM, content)


def developer_with_weather() -> Message:
    tool = ToolDescription.new(WEATHER["name"], WEATHER["description"], WEATHER["parameters"])
    content = DeveloperContent.new().with_function_tools([tool])
    return Message.from_role_and_content(Role.DEVELOPER, content)


def user(text: str) -> Message:
    return Message.from_role_and_content(Role.USER, text)


def tool_output(name: str, text: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, name), text)
        .with_recipient("assistant")
        .with_channel("commentary")
    )


def completion_prompt(enc: HarmonyEncoding, messages: list[Message]) -> list[int]:
    return enc.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT
    )


# -- function calls and multi-turn history ------------------------------------------------------


async def test_analysis_call_then_output_and_final_through_a_chain(enc: HarmonyEncoding) -> None:
    thought = analysis("User wants the weather in Paris.")
    call = fn_call("get_weather", '{"city":"Paris"}')
    answer = final("It is 20°C in Paris.")
    first_ids = generated(enc, thought, call)
    client, source = make_client(
        enc, first_ids, generated(enc, answer), generated(enc, final("Sunny, too."))
    )
    assert isinstance(client.family, HarmonyFamily)

    events = await stream_events(client, input="Weather in Paris?", tools=[WEATHER])
    first = folds_to(events)
    assert set(source.params[0].stop_token_ids) == {200002, 200012}  # <|return|>, <|call|>
    assert source.prompts[0] == completion_prompt(
        enc, [system(), developer_with_weather(), user("Weather in Paris?")]
    )
    assert [i.type for i in first.output] == ["reasoning", "function_call"]
    rs, fc = first.output
    assert rs.id.startswith("rs_") and rs.content[0].text == "User wants the weather in Paris."
    assert rs.content[0].type == "reasoning_text" and rs.status == "completed"
    assert fc.id.startswith("fc_") and fc.call_id.startswith("call_")
    assert (fc.name, json.loads(fc.arguments), fc.status) == (
        "get_weather",
        {"city": "Paris"},
        "completed",
    )
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds
    assert kinds.count("response.function_call_arguments.done") == 1
    # usage: every generated token; reasoning = the analysis message's tokens (header to <|end|>)
    assert first.usage.output_tokens == len(first_ids)
    assert first.usage.output_tokens_details.reasoning_tokens == len(enc.render(thought)) - 2
    assert first.usage.input_tokens == len(source.prompts[0])

    second = await client.responses.create(
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": '{"c": 20}'}],
        previous_response_id=first.id,
        tools=[WEATHER],
    )
    chain = [
        user("Weather in Paris?"),
        thought,
        call,
        tool_output("functions.get_weather", '{"c": 20}'),
    ]
    assert source.prompts[1] == completion_prompt(enc, [system(), developer_with_weather(), *chain])
    assert second.output_text == "It is 20°C in Paris."
    assert second.output[0].phase == "final_answer" and second.output[0].id.startswith("msg_")

    await client.responses.create(input="And tomorrow?", previous_response_id=second.id)
    # the analysis before the last final answer is dropped; the call and its output stay
    later = [user("Weather in Paris?"), call, chain[-1], answer, user("And tomorrow?")]
    assert source.prompts[2] == completion_prompt(enc, [system(), *later])


async def test_commentary_preamble_is_a_commentary_message(enc: HarmonyEncoding) -> None:
    preamble = msg("Let me look that up.", "commentary")
    client, _ = make_client(
        enc, generated(enc, preamble, fn_call("get_weather", '{"city":"Oslo"}'))
    )
    r = folds_to(await stream_events(client, input="Weather?", tools=[WEATHER]))
    assert [i.type for i in r.output] == ["message", "function_call"]
    assert r.output[0].phase == "commentary" and r.output_text == "Let me look that up."


async def test_streamed_equals_plain_and_effort_reaches_the_system_message(
    enc: HarmonyEncoding,
) -> None:
    script = generated(enc, analysis("Easy."), final("Paris."))
    client, source = make_client(enc, script)
    streamed = folds_to(
        await stream_events(client, input="Capital of France?", reasoning={"effort": "high"})
    )
    plain = await client.responses.create(input="Capital of France?", reasoning={"effort": "high"})
    assert strip_ids(plain.model_dump()) == strip_ids(streamed.model_dump())
    assert source.prompts[0] == completion_prompt(
        enc, [system(ReasoningEffort.HIGH), user("Capital of France?")]
    )
    assert "Reasoning: high" in enc.decode(source.prompts[0])


# -- the python tool ------------------------------------------------------------------------------


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
async def test_python_runs_in_one_sandbox_per_response(enc: HarmonyEncoding) -> None:
    s1 = generated(enc, analysis("Compute it."), py_call("x = 6 * 7"))
    s2 = generated(enc, py_call("print(x)"))
    s3 = generated(enc, analysis("It printed 42."), final("The answer is 42."))
    client, source = make_client(enc, s1, s2, s3)
    events = await stream_events(
        client, input="6*7?", tools=[PYTHON], include=["code_interpreter_call.outputs"]
    )
    r = folds_to(events)
    assert [i.type for i in r.output] == [
        "reasoning",
        "code_interpreter_call",
        "code_interpreter_call",
        "reasoning",
        "message",
    ]
    silent, printed = r.output[1], r.output[2]
    assert silent.id.startswith("ci_") and silent.container_id.startswith("cntr_")
    assert silent.container_id == printed.container_id  # one sandbox for the response
    assert (silent.code, silent.status, silent.outputs) == ("x = 6 * 7", "completed", [])
    assert printed.code == "print(x)" and printed.outputs[0].logs == "42\n"
    assert r.output_text == "The answer is 42."
    # the python tool is described in the system message
    assert "## python" in enc.decode(source.prompts[0])
    # each round sees the previous one and the tool's answer, rendered by harmony
    empty = continuation_ids(enc, tool_message("python", "", channel="analysis"))
    answer = continuation_ids(enc, tool_message("python", "42\n", channel="analysis"))
    assert source.prompts[1] == [*source.prompts[0], *s1, *empty]
    assert source.prompts[2] == [*source.prompts[1], *s2, *answer]
    assert "<|start|>python to=assistant<|channel|>analysis<|message|>42\n<|end|>" in enc.decode(
        source.prompts[2]
    )
    # events of one call, in OpenAI's order
    ci = [e.type for e in events if getattr(e, "item_id", None) == printed.id]
    assert ci[0] == "response.code_interpreter_call.in_progress"
    assert ci[-3:] == [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.code_interpreter_call_code.delta"]
    assert "".join(deltas) == "x = 6 * 7print(x)"
    # usage over the three rounds: every prompt is input, every generated token output
    assert r.usage.input_tokens == sum(len(p) for p in source.prompts)
    assert r.usage.output_tokens == len(s1) + len(s2) + len(s3)
    reasoning = [analysis("Compute it."), analysis("It printed 42.")]
    # the analysis messages, each the first of its round (so without <|start|>assistant)
    assert r.usage.output_tokens_details.reasoning_tokens == sum(
        len(enc.render(m)) - 2 for m in reasoning
    )


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
async def test_python_outputs_hidden_unless_included_yet_replayed(enc: HarmonyEncoding) -> None:
    s1 = generated(enc, py_call("print('secret' * 2)"))
    s2 = generated(enc, fn_call("get_weather", '{"city":"Bern"}'))
    client, source = make_client(enc, s1, s2, generated(enc, final("Done.")))
    r = folds_to(await stream_events(client, input="go", tools=[PYTHON, WEATHER]))
    ci, fc = r.output
    assert ci.outputs is None and ci.status == "completed"
    assert [t.type for t in r.tools] == ["code_interpreter", "function"]
    await client.responses.create(
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "ok"}],
        previous_response_id=r.id,
        tools=[PYTHON, WEATHER],
    )
    # the turn in progress keeps the python call and what it printed
    assert "<|message|>secretsecret\n<|end|>" in enc.decode(source.prompts[-1])


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
async def test_built_in_calls_are_bounded(enc: HarmonyEncoding) -> None:
    again = generated(enc, py_call("print(1)"))
    client, source = make_client(enc, again, again, again)
    r = folds_to(await stream_events(client, input="loop", tools=[PYTHON], max_tool_calls=1))
    assert [i.status for i in r.output] == ["completed", "incomplete"]
    assert len(source.prompts) == 2  # the second call did not run; no third round


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
async def test_cancel_while_python_runs(enc: HarmonyEncoding) -> None:
    client, _ = make_client(enc, generated(enc, py_call("import time; time.sleep(60)")))
    queued = await client.responses.create(input="wait", tools=[PYTHON], background=True)
    stream = await client.responses.retrieve(queued.id, stream=True)
    async for e in stream:
        if e.type == "response.code_interpreter_call.interpreting":
            break
    await stream.close()
    r = await asyncio.wait_for(client.responses.cancel(queued.id), 10)  # not the 60 s sleep
    assert r.status == "cancelled" and r.output[0].status == "incomplete"
    check_stream([e async for e in await client.responses.retrieve(r.id, stream=True)])


# -- the browser ----------------------------------------------------------------------------------


class FakeBackend:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def search(self, query: str, *, topn: int = 10) -> str:
        self.calls.append(("search", query))
        return f"[0] results for {query}\n【0†Example†example.com】"

    async def open(
        self, target: str | int, *, cursor: int = -1, loc: int = -1, num_lines: int = -1
    ) -> BrowserResult:
        self.calls.append(("open", target))
        return BrowserResult(
            "[1] Example Domain\nL0: This domain is for examples.", "https://example.com/"
        )

    async def find(self, pattern: str, *, cursor: int = -1) -> str:
        return ""


async def test_browser_search_and_open_on_a_fake_backend(enc: HarmonyEncoding) -> None:
    s1 = generated(enc, analysis("Search first."), browser_call("search", '{"query":"gpt-oss"}'))
    s2 = generated(enc, browser_call("open", '{"id": 0}'))
    s3 = generated(enc, final("It is an example domain."))
    backend = FakeBackend()
    client, source = make_client(enc, s1, s2, s3, browser=backend)
    events = await stream_events(client, input="Look it up", tools=[{"type": "web_search"}])
    r = folds_to(events)
    assert [i.type for i in r.output] == [
        "reasoning",
        "web_search_call",
        "web_search_call",
        "message",
    ]
    search, opened = r.output[1], r.output[2]
    assert search.id.startswith("ws_") and search.status == "completed"
    assert search.action.type == "search" and search.action.query == "gpt-oss"
    assert opened.action.type == "open_page" and opened.action.url == "https://example.com/"
    assert backend.calls == [("search", "gpt-oss"), ("open", 0)]
    assert "## browser" in enc.decode(source.prompts[0])
    seen = enc.decode(source.prompts[1])
    assert "<|start|>browser.search to=assistant<|channel|>analysis<|message|>[0] results" in seen
    ws = [e.type for e in events if getattr(e, "item_id", None) == search.id]
    assert ws == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]


async def test_web_search_needs_a_backend_and_chat_models_refuse_built_ins(
    enc: HarmonyEncoding, tokenizer
) -> None:
    client, source = make_client(enc, [1])
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="x", tools=[{"type": "web_search"}])
    assert err.value.param == "tools[0]" and "browser" in err.value.message
    chat = AsyncResponsesClient(ScriptedTokenSource([[1]]), tokenizer, model="smollm2")
    assert isinstance(chat.family, ChatFamily)
    for kwargs, param in [
        ({"tools": [WEATHER, PYTHON]}, "tools[1]"),
        (
            {"input": [{"type": "code_interpreter_call", "code": "1", "container_id": "c"}]},
            "input[0]",
        ),
        ({"max_tool_calls": 2}, "max_tool_calls"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            await chat.responses.create(**{"input": "x", **kwargs})
        assert err.value.param == param and "gpt-oss" in err.value.message
    assert source.prompts == []


# -- cut-offs, logprobs, strays ----------------------------------------------------------------


async def test_cut_off_mid_analysis_is_incomplete_with_the_partial_reasoning(
    enc: HarmonyEncoding,
) -> None:
    script = generated(enc, analysis("A long long thought that goes on and on."), final("Hi"))
    client, _ = make_client(enc, script, script)
    events = await stream_events(client, input="q", max_output_tokens=6)
    check_stream(events)
    assert events[-1].type == "response.incomplete"
    r = events[-1].response
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "reasoning" and item.status == "incomplete"
    head = enc.decode(script[3:6])  # after <|channel|>analysis<|message|>
    assert item.content[0].text == head and "A long long thought".startswith(head)
    assert r.usage.output_tokens == 6 == r.usage.output_tokens_details.reasoning_tokens
    plain = await client.responses.create(input="q", max_output_tokens=6)
    assert strip_ids(plain.model_dump()) == strip_ids(r.model_dump())


async def test_logprobs_on_harmony_output_text(enc: HarmonyEncoding) -> None:
    text = "Zürich 🤔 ok"
    script = generated(enc, analysis("hmm"), final(text))
    client, source = make_client(enc, Script(script, logprobs=[-0.5] * len(script)))
    events = await stream_events(
        client, input="hi", include=["message.output_text.logprobs"], top_logprobs=3
    )
    r = folds_to(events)
    assert source.params[0].logprobs and source.params[0].top_logprobs == 3
    part = r.output[1].content[0]
    assert part.text == text and len(part.logprobs) == len(enc.encode(text))
    assert b"".join(bytes(lp.bytes) for lp in part.logprobs).decode() == text
    assert any(lp.token.startswith("bytes:") for lp in part.logprobs)  # 🤔 is split
    assert all(lp.logprob == -0.5 and len(lp.top_logprobs) == 3 for lp in part.logprobs)
    deltas = [
        lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs
    ]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]


async def test_tokens_outside_assistant_messages_count_in_usage_only(
    enc: HarmonyEncoding,
) -> None:
    text = (
        "<|channel|>analysis<|message|>a<|end|>"
        "<|start|>user<|message|>x<|end|>"  # the model wrote a user message: not output
        "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    )
    script = enc.encode(text, allowed_special="all")
    client, _ = make_client(enc, script)
    r = folds_to(await stream_events(client, input="hi"))
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output_text == "ok"
    assert r.usage.output_tokens == len(script)


async def test_family_detection() -> None:
    source = ScriptedTokenSource([[1]])
    with pytest.raises(ValueError, match="tokenizer"):
        AsyncResponsesClient(source, None, model="m", family="chat")
    explicit = AsyncResponsesClient(source, None, model="m", family="harmony")
    assert isinstance(explicit.family, HarmonyFamily)
    given = HarmonyFamily(browser=FakeBackend())
    assert AsyncResponsesClient(source, None, model="m", family=given).family is given


PIECES = [
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
    "<|call|>", "<|endoftext|>", "assistant", "user", "analysis", "final", "commentary",
    " to=functions.get_weather", " to=python", " to=browser.search", " to=browser.find",
    "json", " code", '{"query": "x"}', '{"city":', "hello 🙂", "print(1)",
]  # fmt: skip
CHANNELS = ["analysis", "final", "commentary"]
RECIPIENTS = ["", "", " to=functions.get_weather", " to=python", " to=browser.search", " to=x"]
BODIES = ['{"query": "x"}', '{"city": "Bern"}', '{"city":', "hello 🙂", "print(1)", ""]


def noisy_generation(rng, first: bool = True) -> str:
    """Plausible harmony messages, a few of them mangled (what a random model might write)."""
    out = []
    for k in range(rng.randint(1, 4)):
        parts = [] if first and k == 0 else ["<|start|>", "assistant"]
        parts += [rng.choice(RECIPIENTS), "<|channel|>", rng.choice(CHANNELS)]
        parts += [rng.choice(["", " <|constrain|>json", " code"]), "<|message|>"]
        parts += [rng.choice(BODIES), rng.choice(["<|end|>", "<|end|>", "<|call|>", "<|return|>"])]
        for _ in range(rng.choice([0, 0, 1, 3])):  # mangle: drop, replace or insert a piece
            i = rng.randrange(len(parts))
            op = rng.choice(["drop", "replace", "insert"])
            if op == "drop":
                del parts[i]
            elif op == "replace":
                parts[i] = rng.choice(PIECES)
            else:
                parts.insert(i, rng.choice(PIECES))
        out += parts
    return "".join(out)


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
@pytest.mark.parametrize("seed", range(40))
async def test_any_token_sequence_gives_a_well_formed_response(
    enc: HarmonyEncoding, seed: int
) -> None:
    """Noise (what a random-weight model writes) never breaks the protocol. (Function tools
    would put the turn under a grammar, which refuses noise: only built-in tools here.)"""
    import random

    rng = random.Random(seed)
    scripts = [enc.encode(noisy_generation(rng), allowed_special="all") for _ in range(3)]
    client, source = make_client(enc, *scripts, browser=FakeBackend())
    limit = rng.choice([None, 5, 40])
    kwargs = {"max_output_tokens": limit} if limit else {}
    tools = [PYTHON, {"type": "web_search"}]
    events = await stream_events(client, input="hi", tools=tools, max_tool_calls=2, **kwargs)
    check_stream(events)
    r = events[-1].response
    assert r.status in ("completed", "incomplete")
    if r.status == "completed":
        assert dumps(fold(events).output) == dumps(r.output)
    assert len(source.prompts) <= 3  # at most two built-in rounds were run
    longest = max(len(s) for s in scripts)
    assert r.usage.output_tokens <= min(limit or 10**6, longest * len(source.prompts))
    assert r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens


# -- structured outputs and constrained calls (the grammar over the harmony vocabulary) ---------

KINDS = ["inprocess", "http"]
TOOLS = [WEATHER, {**WEATHER, "name": "get_time", "description": "Local time in a city."}]


def refused(r: Response) -> bool:
    """The scripted source applied the mask and the script broke it: the run failed there."""
    return r.status == "failed" and "grammar refuses" in r.error.message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("constrain", [True, False])
async def test_parse_fills_output_parsed_from_the_final_message(
    enc: HarmonyEncoding, kind: str, constrain: bool
) -> None:
    """responses.parse(text_format=Model): the schema is shown in the developer message's
    ``# Response Formats`` section; reasoning is free (not JSON here); the final message,
    headed with or without ``<|constrain|>json``, is held to the schema and parses."""
    from helpers.server import Target
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    answer = msg('{"name":"Paris","population":2100000}', "final", ctype="<|constrain|>json")
    if not constrain:
        answer = final('{"name":"Paris","population":2100000}')
    script = generated(enc, analysis("Not JSON: {{ name=Paris <|fake|>"), answer)
    client, source = make_client(enc, script, script)
    with Target(kind, client) as target:
        parsed = await target.openai().responses.parse(
            model="gpt-oss-tiny", input="Paris?", text_format=City
        )
        assert parsed.status == "completed", parsed.error
        assert parsed.output_parsed == City(name="Paris", population=2100000)
        assert [i.type for i in parsed.output] == ["reasoning", "message"]
        assert parsed.output[0].content[0].text.startswith("Not JSON")
        assert source.params[-1].constraint is not None
        developer = enc.decode(source.prompts[-1]).split("<|start|>")[2]
        head, schema = developer.removesuffix("<|end|>").split("## City\n\n")
        assert head == "developer<|message|># Response Formats\n\n"  # no instructions or tools
        assert json.loads(schema)["required"] == ["name", "population"]  # the SDK's strict schema
        async with target.openai().responses.stream(
            model="gpt-oss-tiny", input="Paris?", text_format=City
        ) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
        assert "response.output_text.delta" in kinds and "response.reasoning_text.delta" in kinds
        assert streamed.output_parsed == City(name="Paris", population=2100000)


CITY_FORMAT = {
    "format": {
        "type": "json_schema",
        "name": "city",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "size": {"enum": ["small", "big"]}},
            "required": ["name", "size"],
            "additionalProperties": False,
        },
    }
}


@pytest.mark.parametrize(
    "bad",
    [
        "Paris is big.",  # not JSON
        '{"name":"Paris"}',  # a required property missing
        '{"name":"Paris","size":"huge"}',  # not in the enum
        '{"name":"Paris","size":"big","x":1}',  # additionalProperties: false
        '{"name": "Paris", "size": "big"}',  # not the compact layout the grammar fixes
    ],
)
async def test_the_grammar_refuses_a_final_answer_off_the_schema(
    enc: HarmonyEncoding, bad: str
) -> None:
    client, _ = make_client(enc, generated(enc, analysis("Think."), final(bad)))
    r = await client.responses.create(input="q", text=CITY_FORMAT)
    assert refused(r), r.error
    assert r.output[0].type == "reasoning"  # the free part came out
    assert not any(i.type == "message" and i.status == "completed" for i in r.output)


async def test_json_object_and_non_strict_schemas(enc: HarmonyEncoding) -> None:
    good = generated(enc, final('{"anything":[1,2]}'))
    client, _ = make_client(enc, good, generated(enc, final("[1,2]")), good)
    r = await client.responses.create(input="q", text={"format": {"type": "json_object"}})
    assert r.status == "completed" and json.loads(r.output_text) == {"anything": [1, 2]}
    r = await client.responses.create(input="q", text={"format": {"type": "json_object"}})
    assert refused(r)  # an array is JSON, but not an object
    loose = {"type": "json_schema", "name": "t", "strict": False, "schema": {"type": "object"}}
    r = await client.responses.create(input="q", text={"format": loose})
    assert r.status == "completed" and json.loads(r.output_text) == {"anything": [1, 2]}


async def test_what_cannot_be_enforced_is_a_400(enc: HarmonyEncoding) -> None:
    client, source = make_client(enc, generated(enc, final("{}")))
    unique = {"type": "array", "uniqueItems": True}
    strict_unique = {  # strict in every way but the keyword the engine cannot enforce
        "type": "object",
        "properties": {"a": unique},
        "required": ["a"],
        "additionalProperties": False,
    }
    fmt = {
        "type": "json_schema",
        "name": "t",
        "schema": strict_unique,
        "strict": True,
    }
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="q", text={"format": fmt})
    assert err.value.param == "text.format.schema" and "uniqueItems" in err.value.message
    loose = {**WEATHER, "parameters": strict_unique, "strict": True}  # without strict: no 400
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="q", tools=[loose])
    assert err.value.param == "tools[0].parameters"
    assert source.prompts == []


@pytest.mark.parametrize(
    "bad",
    [
        fn_call("get_wetter", '{"city":"Bern"}'),  # not a given tool
        fn_call("get_weather", '{"town":"Bern"}'),  # off the strict schema
        fn_call("get_weather", "{city: Bern}"),  # not JSON
        msg('{"city":"Bern"}', "commentary", "functions.get_weather"),  # no <|constrain|>json
        msg('{"city":"Bern"}', "commentary", "lookup", "<|constrain|>json"),  # not a function
    ],
)
async def test_a_call_the_tools_do_not_allow_cannot_come_out(
    enc: HarmonyEncoding, bad: Message
) -> None:
    """tool_choice "auto": free until the model addresses a function; from there the name is
    one of the tools' and the arguments their schema."""
    client, _ = make_client(enc, generated(enc, analysis("Call it."), bad))
    events = await stream_events(client, input="q", tools=TOOLS)
    check_stream(events)
    r = events[-1].response
    assert refused(r), r.error
    assert not any(i.type == "function_call" and i.status == "completed" for i in r.output)


async def test_auto_leaves_the_model_free_until_it_addresses_a_function(
    enc: HarmonyEncoding,
) -> None:
    plain = generated(enc, analysis("No tool needed."), final("Hello! {not json}"))
    text = (
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
        # the recipient after the channel, as the harmony guide also shows it
        '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"city":"Bern"}'
        "<|call|>"
    )
    call = enc.encode(text, allowed_special="all")
    client, source = make_client(enc, plain, call)
    r = await client.responses.create(input="hi", tools=TOOLS)
    assert r.status == "completed" and r.output_text == "Hello! {not json}"
    assert source.params[0].constraint is not None
    r = await client.responses.create(input="time?", tools=TOOLS)
    assert r.status == "completed", r.error
    assert [i.type for i in r.output] == ["message", "function_call"]
    assert (r.output[1].name, r.output[1].arguments) == ("get_time", '{"city":"Bern"}')


async def test_required_and_named_tool_choice(enc: HarmonyEncoding) -> None:
    time_call = generated(enc, analysis("Need the time."), fn_call("get_time", '{"city":"Rome"}'))
    answer = generated(enc, analysis("I know this."), final("It is noon."))
    client, source = make_client(enc, time_call, answer, time_call, time_call)
    r = await client.responses.create(input="q", tools=TOOLS, tool_choice="required")
    assert r.status == "completed" and [i.type for i in r.output] == ["reasoning", "function_call"]
    assert r.output[1].name == "get_time" and r.output[1].status == "completed"
    r = await client.responses.create(input="q", tools=TOOLS, tool_choice="required")
    assert refused(r) and r.output[0].type == "reasoning"  # no answer instead of a call
    named = {"type": "function", "name": "get_weather"}
    r = await client.responses.create(input="q", tools=TOOLS, tool_choice=named)
    assert refused(r)  # another tool than the named one
    named = {"type": "function", "name": "get_time"}
    r = await client.responses.create(input="q", tools=TOOLS, tool_choice=named)
    assert r.status == "completed" and r.output[-1].name == "get_time"
    # the turn ends after the call: <|call|> stops the engine
    assert 200012 in source.params[-1].stop_token_ids


@pytest.mark.parametrize("reasoning", [False, True])
async def test_no_budget_cuts_a_call_into_broken_json(enc: HarmonyEncoding, reasoning) -> None:
    """Issue 38: whatever ``max_output_tokens`` cuts, the call comes out whole (its arguments
    parse: the closing ends it in time) or not at all, never with broken arguments; a budget
    too small for the shortest call gives an incomplete response and no call."""
    first = [analysis("Need the weather.")] if reasoning else []
    script = generated(enc, *first, fn_call("get_weather", '{"city":"Reykjavik"}'))
    closed_early = 0
    for budget in range(1, len(script) + 2):
        client, _ = make_client(enc, script)
        r = await client.responses.create(
            input="q", tools=TOOLS, tool_choice="required", max_output_tokens=budget
        )
        calls = [i for i in r.output if i.type == "function_call"]
        if budget > len(script):
            assert r.status == "completed" and calls[0].arguments == '{"city":"Reykjavik"}'
            continue
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        for call in calls:
            assert call.status == "completed" and set(json.loads(call.arguments)) == {"city"}
            closed_early += 1
        if budget < 10:
            assert not calls and r.usage.output_tokens == 0  # not even the shortest call fits
    assert closed_early


@needs_bwrap  # runs the python tool: its sandbox needs bubblewrap
async def test_built_in_calls_stay_free_beside_function_tools(enc: HarmonyEncoding) -> None:
    s1 = generated(enc, analysis("Compute."), py_call("print(6 * 7)"))
    s2 = generated(enc, final('{"name":"x","size":"big"}'))
    client, source = make_client(enc, s1, s2)
    r = await client.responses.create(input="q", tools=[PYTHON, WEATHER], text=CITY_FORMAT)
    assert r.status == "completed", r.error
    assert [i.type for i in r.output] == ["reasoning", "code_interpreter_call", "message"]
    assert json.loads(r.output_text) == {"name": "x", "size": "big"}
    assert len(source.prompts) == 2  # a fresh grammar for the round after the tool's answer
