"""The frame tests' builders make valid openai objects and spell bytes as the API does."""

from __future__ import annotations

import math

from helpers.frames import logprob, message, response, stream, token_text, tool_call
from openai.types.responses import Response, ResponseStreamEvent


def test_builders_make_valid_openai_objects() -> None:
    from pydantic import TypeAdapter

    final = response(
        message([[logprob("Hi", math.log(0.5), [("Hi", math.log(0.5)), ("Yo", -1.0)])], None]),
        tool_call(),
    )
    assert Response.model_validate(final.model_dump()).model_dump() == final.model_dump()
    adapter = TypeAdapter(ResponseStreamEvent)
    events = stream(final)
    for event in events:
        assert adapter.validate_python(event.model_dump()).model_dump() == event.model_dump()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "Hi"


def test_token_text_spells_partial_characters_as_bytes() -> None:
    assert token_text("é".encode()[:1]) == "bytes:\\xc3"
    assert token_text(b"ok") == "ok"
