"""``responses.create`` parameters as ``protocol/request.py`` validates them: the tool choice
and parallel calls a family is handed, the 400s that name the parameter, and the SDK's
transport knobs."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from helpers.responses import WEATHER, client_for
from openai.types.responses import ToolChoiceFunction

from nbresponses.protocol.request import CreateRequest, parse_create

NAMED = {"type": "function", "name": "get_weather"}


def parse(**kwargs: Any) -> CreateRequest:
    return parse_create({"input": "q", **kwargs}, model="m")


@pytest.mark.parametrize(
    ("choice", "mode", "forced"),
    [
        ("auto", "auto", None),
        ("none", "none", None),
        ("required", "required", None),
        (NAMED, "required", "get_weather"),  # a named function is a required call to it
        (ToolChoiceFunction(**NAMED), "required", "get_weather"),  # the SDK's model alike
    ],
)
def test_tool_choice_gives_the_mode_and_the_forced_tool(choice, mode, forced):
    req = parse(tools=[WEATHER], tool_choice=choice)
    assert (req.tool_mode, req.forced_tool) == (mode, forced)
    assert req.tool_choice == (NAMED if forced else choice)  # echoed on the Response


def test_tool_choice_is_auto_and_parallel_calls_on_unless_asked():
    req = parse(tools=[WEATHER])
    assert (req.tool_mode, req.forced_tool, req.parallel_tool_calls) == ("auto", None, True)
    assert parse(tools=[WEATHER], parallel_tool_calls=False).parallel_tool_calls is False


@pytest.mark.parametrize(
    ("kwargs", "param", "says"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
        ({"tools": [WEATHER], "tool_choice": {**NAMED, "name": "x"}}, "tool_choice", "'x'"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ],
)
def test_a_tool_choice_that_cannot_be_honoured_is_a_400(kwargs, param, says):
    with pytest.raises(openai.BadRequestError) as err:
        parse(**kwargs)
    assert err.value.status_code == 400 and err.value.param == param
    assert says in err.value.message


async def test_transport_knobs_accepted(tokenizer):
    client, _ = client_for(tokenizer, "ok")
    r = await client.responses.create(
        input="hi",
        model="smollm2",
        extra_headers={"X-A": "1"},
        extra_query={"q": 1},
        timeout=5,
        extra_body={"metadata": {"k": "v"}},
        user="me",
        metadata=None,
    )
    assert r.metadata == {"k": "v"} and r.user == "me" and r.output_text == "ok"
