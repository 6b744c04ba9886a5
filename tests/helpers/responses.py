"""Protocol tests' tools: a scripted client on the real tokenizer, and checks of event validity,
nesting and folding with the SDK."""

from __future__ import annotations

from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.stream import ResponseEventStream
from nbresponses.tokens.scripted import Script, ScriptedTokenSource

EVENT = TypeAdapter(ResponseStreamEvent)

# A strict function tool (strict by default, as on OpenAI) several tests call.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# A second tool (its city bounded: a small model may ramble) ...
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The local time in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# ... and a Hermes call to the first, as SmolLM2's chat template asks the model to write one.
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'


EOS = 2
MODEL = "smollm2"


def ids(tokenizer, text: str, eos: bool = True) -> list[int]:
    return tokenizer.encode(text) + ([EOS] if eos else [])


def client_for(tokenizer, *scripts, **kw) -> tuple[AsyncResponsesClient, ScriptedTokenSource]:
    source = ScriptedTokenSource(
        [s if isinstance(s, Script) else Script(ids(tokenizer, s)) for s in scripts],
        eos_token_ids=(EOS,),
        context_length=kw.pop("context_length", 8192),
    )
    return AsyncResponsesClient(source, tokenizer, model=MODEL, **kw), source


async def stream_events(client, **kwargs) -> list:
    stream = await client.responses.create(stream=True, **kwargs)
    assert isinstance(stream, ResponseEventStream)
    async with stream:
        return [e async for e in stream]


def prompt_text(tokenizer, source, call: int = -1) -> str:
    return tokenizer.decode(source.prompts[call], clean_up_tokenization_spaces=False)


def check_stream(events: list) -> None:
    """Every event validates; sequence numbers 0..n; items and parts nest; deltas join."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for e in events:
        again = EVENT.validate_python(e.model_dump(mode="json", by_alias=True))
        assert type(again) is type(e) and again.model_dump() == e.model_dump()
    item = part = None  # the open output index and content index
    count = 0
    text: dict[tuple[int, int], str] = {}
    args: dict[int, str] = {}
    for e in events:
        t = e.type
        if t == "response.output_item.added":
            assert item is None and e.output_index == count
            item = e.output_index
            count += 1
        elif t == "response.output_item.done":
            assert item == e.output_index and part is None
            item = None
            if e.item.type == "function_call":
                assert e.item.arguments == args.get(e.output_index, "")
        elif t == "response.content_part.added":
            assert item == e.output_index and part is None
            part = e.content_index
        elif t == "response.content_part.done":
            assert (item, part) == (e.output_index, e.content_index)
            part = None
        elif t in ("response.output_text.delta", "response.reasoning_text.delta"):
            assert (item, part) == (e.output_index, e.content_index)
            text[(item, part)] = text.get((item, part), "") + e.delta
        elif t in ("response.output_text.done", "response.reasoning_text.done"):
            assert (item, part) == (e.output_index, e.content_index)
            assert text.get((item, part), "") == e.text
        elif t == "response.function_call_arguments.delta":
            assert item == e.output_index
            args[item] = args.get(item, "") + e.delta
        elif t == "response.function_call_arguments.done":
            assert args.get(item, "") == e.arguments
    assert item is None and part is None


def fold(events: list):
    """The openai SDK's own accumulator over our events: its final Response."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for e in events:
        state.handle_event(e)
    parsed = state._completed_response
    return (
        None
        if parsed is None
        else Response.model_validate(_unparsed(parsed.model_dump(by_alias=True)))
    )


_EXTRAS = ("parsed", "parsed_arguments", "async")


def _unparsed(value):
    """Drop the SDK's ``parsed`` extras (structured outputs) to get a plain Response."""
    if isinstance(value, dict):
        return {k: _unparsed(v) for k, v in value.items() if k not in _EXTRAS}
    if isinstance(value, list):
        return [_unparsed(v) for v in value]
    return value


def strip_ids(value):
    """A dumped response with every id and time blanked, to compare two runs of one script."""
    if isinstance(value, dict):
        return {
            k: (None if k in ("id", "call_id", "created_at", "completed_at") else strip_ids(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_ids(v) for v in value]
    return value


def dumps(items) -> list[dict]:
    """Items as plain dicts (None fields dropped): SDK alias quirks aside, equal means equal."""
    return [i.model_dump(exclude_none=True) for i in items]
