"""Python callables as tools: schemas from signatures, and the tool loop."""

from __future__ import annotations

import asyncio

import pytest
from helpers.responses import client_for, prompt_text

import nbresponses as nbr
from nbresponses.service.function_tools import function_tool


def get_weather(city: str, unit: str = "celsius") -> dict:
    """Current weather for a city.

    Args:
        city: The city name.
        unit: celsius or fahrenheit.
    """
    return {"city": city, "temp": 21, "unit": unit}


async def slow_add(a: int, b: int) -> int:
    """Add two integers, slowly.

    :param a: first
    :param b: second
    """
    await asyncio.sleep(0)
    return a + b


def broken(x: int) -> str:
    """Always fails."""
    raise ValueError(f"no luck with {x}")


def test_function_tool_schema():
    spec = nbr.function_tool(get_weather)
    assert spec.name == "get_weather" and spec.description == "Current weather for a city."
    props = spec.parameters["properties"]
    assert props["city"] == {"type": "string", "description": "The city name."}
    assert props["unit"]["default"] == "celsius"
    assert spec.parameters["required"] == ["city"]
    assert spec.param["type"] == "function" and spec.param["name"] == "get_weather"
    add = function_tool(name="adder")(slow_add)
    assert add.name == "adder" and add.parameters["properties"]["a"]["description"] == "first"


async def test_tool_loop_runs_sync_async_and_failing_tools(tokenizer):
    calls = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "slow_add", "arguments": {"a": 2, "b": "3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "broken", "arguments": {"x": 7}}\n</tool_call>\n'
        '<tool_call>\n{"name": "missing", "arguments": {}}\n</tool_call>'
    )
    client, source = client_for(tokenizer, calls, "Oslo is 21 degrees and 2 + 3 = 5.")
    r = await client.responses.run(input="Weather and sum?", tools=[get_weather, slow_add, broken])
    assert r.output_text == "Oslo is 21 degrees and 2 + 3 = 5."
    p = prompt_text(tokenizer, source)
    assert '"temp": 21' in p and "<tool_response>\n5\n</tool_response>" in p
    assert "Error: ValueError: no luck with 7" in p
    assert "Error: there is no tool named 'missing'" in p


async def test_tool_loop_bounded(tokenizer):
    call = '<tool_call>\n{"name": "slow_add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    client, source = client_for(tokenizer, call)
    r = await client.responses.run(input="loop", tools=[slow_add], max_turns=3)
    assert len(source.prompts) == 3 and r.output[0].type == "function_call"
    with pytest.raises(ValueError):
        await client.responses.run(input="x", tools=[slow_add], stream=True)
