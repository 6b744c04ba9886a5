"""Which schema a request's tools and format are held to: OpenAI's strict rules only where
``strict: true`` is asked; otherwise normalization or best effort, never a 400 for them."""

from __future__ import annotations

import openai
import pytest

from nbresponses.families.constrain import output_schema, tool_schemas
from nbresponses.protocol.request import parse_create

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
LOOSE = {  # an ordinary schema: optional property, no additionalProperties, nested object
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
    },
    "required": ["city"],
}
UNIQUE = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["tags"],
}


def tool(parameters, **extra):
    return {"type": "function", "name": "get_weather", "parameters": parameters, **extra}


def schemas(*tools):
    return tool_schemas(parse_create({"input": "x", "tools": list(tools)}, model="m"))


@pytest.mark.parametrize("extra", [{}, {"strict": None}])
def test_omitted_strict_normalizes_an_ordinary_schema(extra):
    (s,) = schemas(tool(LOOSE, **extra))
    assert s.mode == "normalized" and s.strict
    args = s.arguments
    assert args["additionalProperties"] is False
    assert args["properties"]["where"]["additionalProperties"] is False  # nested too
    assert args["required"] == ["city"]  # optional properties stay optional
    assert "additionalProperties" not in LOOSE  # the request's schema is not touched


def test_omitted_strict_with_a_keyword_the_engine_cannot_enforce_is_best_effort():
    (s,) = schemas(tool(UNIQUE))
    assert s.mode == "best_effort" and not s.strict
    assert s.dropped == ("$.properties.tags.uniqueItems",)
    assert s.arguments["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert "additionalProperties" not in s.arguments  # the schema as given, less the keyword


def test_strict_false_holds_the_arguments_to_the_schema_as_given():
    (s,) = schemas(tool(LOOSE, strict=False))
    assert s.mode == "best_effort" and s.dropped == () and s.arguments == LOOSE


def test_strict_true_keeps_the_strict_rules():
    with pytest.raises(openai.BadRequestError) as err:
        schemas(tool(CITY, strict=True))
    assert err.value.param == "tools[0].parameters"
    assert "$.additionalProperties" in err.value.message
    strict = {**CITY, "additionalProperties": False}
    (s,) = schemas(tool(strict, strict=True))
    assert s.mode == "strict" and s.arguments == strict


def test_a_tool_without_parameters_takes_an_empty_object():
    (s,) = tool_schemas(
        parse_create({"input": "x", "tools": [{"type": "function", "name": "now"}]}, model="m")
    )
    assert s.arguments["properties"] == {} and s.arguments["additionalProperties"] is False


def _format(schema, **extra):
    text = {"format": {"type": "json_schema", "name": "t", "schema": schema, **extra}}
    return output_schema(parse_create({"input": "x", "text": text}, model="m"))


def test_a_format_without_strict_is_best_effort_and_strict_true_is_checked():
    assert _format(LOOSE) == LOOSE  # not strict: no 400, the schema as given
    assert "uniqueItems" not in _format(UNIQUE)["properties"]["tags"]
    for schema in (LOOSE, UNIQUE):
        with pytest.raises(openai.BadRequestError) as err:
            _format(schema, strict=True)
        assert err.value.param == "text.format.schema"


def test_a_schema_that_cannot_compile_at_all_falls_back_to_any_json():
    weird = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    (s,) = schemas(tool(weird))
    assert s.mode == "best_effort" and s.dropped == ("$.properties.a.not",)
    assert s.arguments["properties"]["a"] == {}
