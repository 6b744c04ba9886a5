"""Function tools as real clients send them, in process and over HTTP: no ``strict`` (the plain
SDK, vLLM's own tests), ``strict: null`` (langchain, pydantic-ai), ``strict: false`` and
``strict: true`` (openai-agents). Only ``strict: true`` with a schema off the strict rules is a
400; the others run, held to the normalized schema or the schema as given."""

from __future__ import annotations

import json

import openai
import pytest
from helpers.responses import MODEL
from helpers.server import Target, scripted, tool_call

KINDS = ["inprocess", "http"]
PARAMETERS = {  # an ordinary schema: an optional enum, no additionalProperties
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
}
TOOL = {
    "type": "function",
    "name": "get_current_weather",
    "description": "Get the current weather in a given location",
    "parameters": PARAMETERS,
}
SHAPES = {
    "sdk": TOOL,  # no strict key at all (the SDK's own example, vLLM's tests)
    "langchain": {**TOOL, "strict": None},  # bind_tools without strict=...
    "non_strict": {**TOOL, "strict": False},
}
CALL = tool_call("get_current_weather", {"location": "Paris, France", "unit": "celsius"})


def required(call: str) -> str:
    """What the model writes with tool_choice "required": the prompt opened the call."""
    return call.removeprefix("<tool_call>\n")


pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("choice", ["auto", "required"])
async def test_an_ordinary_tool_schema_runs_and_round_trips(tokenizer, kind, shape, choice):
    call = CALL if choice == "auto" else required(CALL)
    client, source = scripted(tokenizer, call, "It is 18 degrees in Paris.")
    with Target(kind, client) as target:
        sdk = target.openai()
        r = await sdk.responses.create(
            model=MODEL,
            input="What is the weather like in Paris today?",
            tools=[SHAPES[shape]],
            tool_choice=choice,
        )
        assert r.status == "completed", r.error
        (call,) = [i for i in r.output if i.type == "function_call"]
        assert call.name == "get_current_weather"
        assert json.loads(call.arguments) == {"location": "Paris, France", "unit": "celsius"}
        r2 = await sdk.responses.create(
            model=MODEL,
            previous_response_id=r.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
            tools=[SHAPES[shape]],
        )
        assert r2.output_text == "It is 18 degrees in Paris."
    assert "18C" in tokenizer.decode(source.prompts[1])


@pytest.mark.parametrize("kind", KINDS)
async def test_optional_properties_stay_optional(tokenizer, kind):
    client, _ = scripted(
        tokenizer, required(tool_call("get_current_weather", {"location": "Oslo"}))
    )
    with Target(kind, client) as target:
        r = await target.openai().responses.create(
            model=MODEL, input="Weather in Oslo?", tools=[TOOL], tool_choice="required"
        )
        assert r.status == "completed" and json.loads(r.output[0].arguments) == {"location": "Oslo"}


@pytest.mark.parametrize("kind", KINDS)
async def test_without_strict_objects_are_closed_but_strict_false_keeps_the_schema(tokenizer, kind):
    """Normalization closes objects (no keys the schema does not name); ``strict: false``
    holds the arguments to the schema as given, which allows them."""
    extra = required(tool_call("get_current_weather", {"location": "Oslo", "when": "now"}))
    client, _ = scripted(tokenizer, extra, extra)
    with Target(kind, client) as target:
        sdk = target.openai()
        r = await sdk.responses.create(model=MODEL, input="x", tools=[TOOL], tool_choice="required")
        assert r.status == "failed" and "grammar" in r.error.message  # a script is not a model
        loose = {**TOOL, "strict": False}
        r = await sdk.responses.create(
            model=MODEL, input="x", tools=[loose], tool_choice="required"
        )
        assert r.status == "completed"
        assert json.loads(r.output[0].arguments) == {"location": "Oslo", "when": "now"}


@pytest.mark.parametrize("kind", KINDS)
async def test_strict_true_off_the_rules_is_still_a_400_naming_the_path(tokenizer, kind):
    client, source = scripted(tokenizer, CALL)
    with Target(kind, client) as target:
        with pytest.raises(openai.BadRequestError) as err:
            await target.openai().responses.create(
                model=MODEL, input="x", tools=[{**TOOL, "strict": True}]
            )
        assert err.value.param == "tools[0].parameters"
        assert "$.additionalProperties" in err.value.message
    assert not source.prompts


@pytest.mark.parametrize("kind", KINDS)
async def test_a_required_call_cut_by_the_budget_is_closed_as_valid_json(tokenizer, kind):
    """vLLM's "max tokens with required": the arguments end as JSON the schema takes (the call
    item is whole), and the response says the budget ended them."""
    place = " ".join(f"place{i}" for i in range(60))  # long, and no loop the guard would end
    long = required(tool_call("get_current_weather", {"location": place}))
    client, _ = scripted(tokenizer, long)
    with Target(kind, client) as target:
        r = await target.openai().responses.create(
            model=MODEL, input="x", tools=[TOOL], tool_choice="required", max_output_tokens=32
        )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (call,) = r.output
    assert call.type == "function_call" and call.status == "completed"  # whole JSON
    args = json.loads(call.arguments)
    assert set(args) <= {"location", "unit"} and args["location"].startswith("place0 place1")
    assert r.usage.output_tokens <= 32
