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
        '<tool_call>\n{"name": "slow_add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "broken", "arguments": {"x": 7}}\n</tool_call>'
    )  # a call to a tool not given cannot be generated: the grammar allows only their names
    client, source = client_for(tokenizer, calls, "Oslo is 21 degrees and 2 + 3 = 5.")
    r = await client.responses.run(input="Weather and sum?", tools=[get_weather, slow_add, broken])
    assert r.output_text == "Oslo is 21 degrees and 2 + 3 = 5."
    p = prompt_text(tokenizer, source)
    assert '"temp": 21' in p and "<tool_response>\n5\n</tool_response>" in p
    assert "Error: ValueError: no luck with 7" in p


async def test_tool_loop_bounded(tokenizer):
    call = '<tool_call>\n{"name": "slow_add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    client, source = client_for(tokenizer, call)
    r = await client.responses.run(input="loop", tools=[slow_add], max_turns=3)
    assert len(source.prompts) == 3 and r.output[0].type == "function_call"
    with pytest.raises(ValueError):
        await client.responses.run(input="x", tools=[slow_add], stream=True)


WAIT_CALL = '<tool_call>\n{"name": "wait", "arguments": {"seconds": 1.0}}\n</tool_call>'


async def test_a_blocking_tool_does_not_block_the_event_loop(tokenizer):
    """A plain function runs in a worker thread, and a response's calls run side by side:
    each call blocks until the event loop has answered it and until the other call is
    running too, which could never happen if either ran on the loop (it once did)."""
    import threading

    both = threading.Barrier(2, timeout=30)
    loop = asyncio.get_running_loop()

    def wait(seconds: float) -> str:
        answered = threading.Event()
        loop.call_soon_threadsafe(answered.set)  # runs only if the loop is free
        assert answered.wait(timeout=30), "the event loop was blocked"
        both.wait()  # the other call is running at the same time
        return "waited"

    client, source = client_for(tokenizer, WAIT_CALL + "\n" + WAIT_CALL, "done")
    r = await client.responses.run(input="wait twice", tools=[wait])
    assert r.output_text == "done" and prompt_text(tokenizer, source).count("waited") == 2


async def test_a_call_over_its_time_limit_is_an_error_the_model_reads(tokenizer):
    finished = asyncio.Event()
    cancelled = asyncio.Event()

    @function_tool(timeout=0.2)
    async def wait(seconds: float) -> str:
        """Waits."""
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        finished.set()
        return "waited"

    client, source = client_for(tokenizer, WAIT_CALL, "gave up")
    r = await client.responses.run(input="wait", tools=[wait])
    assert r.output_text == "gave up" and cancelled.is_set() and not finished.is_set()
    assert "Error: the tool timed out: 'wait' did not finish within 0.2 s." in prompt_text(
        tokenizer, source
    )
    assert function_tool(get_weather).timeout == 60.0  # the documented default
    with pytest.raises(ValueError, match="timeout must be a positive"):
        function_tool(get_weather, timeout=0)


async def test_a_hanging_plain_function_times_out_too(tokenizer):
    import threading

    release = threading.Event()

    def wait(seconds: float) -> str:
        release.wait(seconds * 10)
        return "waited"

    client, source = client_for(tokenizer, WAIT_CALL, "gave up")
    try:
        r = await client.responses.run(input="wait", tools=[function_tool(wait, timeout=0.2)])
    finally:
        release.set()  # the worker thread cannot be stopped; let it go
    assert r.output_text == "gave up" and "did not finish within 0.2 s" in prompt_text(
        tokenizer, source
    )


async def test_cancelling_the_loop_cancels_its_tool_calls(tokenizer):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def wait(seconds: float) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "waited"

    client, _ = client_for(tokenizer, WAIT_CALL, "never")
    loop = asyncio.create_task(client.responses.run(input="wait", tools=[wait]))
    await asyncio.wait_for(started.wait(), 10)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert cancelled.is_set()
