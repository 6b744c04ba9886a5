"""The held-out schema battery on the real bundled model (SmolLM2-135M) at temperature 0:
every answer parses and validates within ``max_output_tokens=400``, the calendar event of
vLLM's own test included (``create`` and ``responses.parse``); the repetition guard and the
budget-aware closing give the same bits alone and batched."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from helpers.schema_battery import BATTERY
from pydantic import BaseModel

from nbresponses.grammar import SchemaError, check_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]
BUDGET = 400


def _format(name: str, schema: dict) -> dict:
    fmt = {"type": "json_schema", "name": name, "schema": schema}
    try:
        check_schema(schema, strict=True)
        fmt["strict"] = True  # what responses.parse sends
    except SchemaError:
        pass  # optional properties: not strict, the schema as given
    return {"format": fmt}


async def _ask(engine, name, prompt, schema, **kw):
    return await engine.client().responses.create(
        input=prompt, text=_format(name, schema), temperature=0, max_output_tokens=BUDGET, **kw
    )


async def test_every_answer_of_the_battery_parses_and_validates(engine):
    assert len(BATTERY) >= 20
    responses = await asyncio.gather(*(_ask(engine, *case) for case in BATTERY))
    tokens = []
    for (name, _, schema), r in zip(BATTERY, responses, strict=True):
        jsonschema.validate(json.loads(r.output_text), schema)  # every one, whatever its status
        assert r.usage.output_tokens <= BUDGET
        if r.status != "completed":  # the budget ended it, and the response says so
            assert r.status == "incomplete", (name, r.error)
            assert r.incomplete_details.reason == "max_output_tokens"
        tokens.append(r.usage.output_tokens)
    completed = sum(r.status == "completed" for r in responses)
    assert completed >= len(BATTERY) // 2  # most end by the model's own choice
    print(
        f"battery: {len(BATTERY)} valid, {completed} completed, median tokens "
        f"{sorted(tokens)[len(tokens) // 2]}"
    )


class CalendarEvent(BaseModel):
    name: str
    date: str
    participants: list[str]


async def test_the_calendar_event_parses(engine):
    """vLLM's structured-output test: before the guard the model listed "Mike" until the
    budget ran out; now it parses in create and in responses.parse."""
    text = "Alice and Bob are going to a science fair on Friday."
    sdk = engine.openai()
    parsed = await sdk.responses.parse(
        model=engine.model,
        input=[
            {"role": "system", "content": "Extract the event information."},
            {"role": "user", "content": text},
        ],
        text_format=CalendarEvent,
        temperature=0,
        max_output_tokens=BUDGET,
    )
    assert isinstance(parsed.output_parsed, CalendarEvent)
    name, prompt, schema = BATTERY[0]
    assert name == "calendar_event"
    r = await _ask(engine, name, prompt, schema)
    assert r.status == "completed"
    event = CalendarEvent.model_validate_json(r.output_text)
    assert len(event.participants) < 20
    off = await _ask(engine, name, prompt, schema, extra_body={"repetition_guard": False})
    assert off.usage.output_tokens > r.usage.output_tokens  # unguarded, it loops longer
    jsonschema.validate(json.loads(off.output_text), schema)  # and is still closed in time


async def test_guarded_and_closed_answers_are_the_same_bits_alone_and_batched(engine):
    cases = [c for c in BATTERY if c[0] in ("calendar_event", "steps", "books", "tags")]
    # a budget some answers outrun, so the closing takes part (160 did on the earlier default)
    kw = {"include": ["message.output_text.logprobs"], "top_logprobs": 2, "max_output_tokens": 80}

    async def ask(case):
        name, prompt, schema = case
        r = await engine.client().responses.create(
            input=prompt, text=_format(name, schema), temperature=0, **kw
        )
        lps = [(t.token, t.logprob) for t in r.output[-1].content[0].logprobs]
        return r.output_text, r.status, lps

    alone = [await ask(c) for c in cases]
    together = await asyncio.gather(*(ask(c) for c in cases))
    assert alone == list(together)
    statuses = [status for _, status, _ in alone]
    assert "incomplete" in statuses, statuses  # closing took part
