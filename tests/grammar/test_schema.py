"""What a JSON schema may ask of the engine (``grammar/schema.py``): the keywords it enforces,
OpenAI's strict rules, the normalization that closes objects, and the best-effort fallback."""

from __future__ import annotations

import pytest

from nbresponses.grammar import SchemaError, best_effort, check_schema, closed

STRICT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "at": {"type": "object", "properties": {}}},
    "required": ["city", "at"],
    "additionalProperties": False,
}


def where(schema, *, strict: bool) -> str:
    with pytest.raises(SchemaError) as err:
        check_schema(schema, strict=strict)
    return err.value.where


def test_every_keyword_is_enforced_or_named():
    check_schema({"type": "string", "title": "a name", "x-note": 1}, strict=False)  # annotations
    unique = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    assert where({"type": "object", "properties": {"t": unique}}, strict=False) == (
        "$.properties.t.uniqueItems"
    )
    assert where(["not", "an", "object"], strict=False) == "$"


def test_strict_adds_openais_rules():
    check_schema(STRICT, strict=False)  # without strict, an open nested object is fine
    assert where({"type": "string"}, strict=True) == "$.type"  # the root is an object
    assert where(STRICT, strict=True) == "$.properties.at.additionalProperties"
    shut = {"type": "object", "properties": {}, "additionalProperties": False}
    check_schema({**STRICT, "properties": {**STRICT["properties"], "at": shut}}, strict=True)
    optional = {**STRICT, "properties": {"city": {"type": "string"}}, "required": []}
    assert where(optional, strict=True) == "$.required"  # every property must be required


def test_closed_shuts_every_object_that_does_not_say_otherwise():
    schema = {"type": "object", "properties": {"in": {"type": "object"}}, "required": []}
    shut = closed(schema)
    assert shut["additionalProperties"] is False
    assert shut["properties"]["in"]["additionalProperties"] is False
    assert shut["required"] == [] and "additionalProperties" not in schema  # a copy
    assert closed({"type": "object", "additionalProperties": True})["additionalProperties"]


def test_best_effort_leaves_out_what_cannot_be_enforced_and_says_where():
    schema = {
        "type": "object",
        "properties": {"t": {"type": "array", "uniqueItems": True}, "n": {"not": {}}},
    }
    kept, dropped = best_effort(schema)
    assert dropped == ["$.properties.t.uniqueItems", "$.properties.n.not"]
    assert kept["properties"] == {"t": {"type": "array"}, "n": {}}
    assert "uniqueItems" in schema["properties"]["t"]  # the request's schema is not touched
