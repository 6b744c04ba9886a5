"""What a JSON schema may ask of the engine: the keywords it enforces, and OpenAI's strict rules.

Every keyword is either enforced token by token or refused with a ``SchemaError`` that names the
JSON path of the keyword (the caller turns it into a 400): a schema is never run half-enforced.
``strict=True`` adds OpenAI's strict-mode rules (structured outputs and strict function tools):
the root is an object, every object lists all its properties in ``required`` and sets
``additionalProperties: false``, and the combinators beyond ``anyOf`` are not used.

Where a request does not ask for strict mode, OpenAI never refuses a schema for these rules: it
normalizes a function tool's schema when it can and otherwise calls the function best-effort.
``closed`` is the normalization (objects that do not say otherwise take no extra keys) and
``best_effort`` the fallback (every keyword that can be enforced is, the others are named and
left out); ``families/constrain.py`` says which applies when.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llguidance

# Annotations: no constraint to enforce.
META = frozenset(
    {
        "$schema", "$id", "$comment", "$anchor", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "nullable",
    }
)  # fmt: skip
# Enforced by llguidance.
ENFORCED = frozenset(
    {
        "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
        "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minProperties", "maxProperties", "patternProperties",
    }
)  # fmt: skip
NOT_STRICT = frozenset({"oneOf", "allOf", "patternProperties", "minProperties", "maxProperties"})
# Keywords whose value is one schema / a map of schemas / a list of schemas.
ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
MANY_BY_NAME = ("properties", "$defs", "definitions", "patternProperties")
MANY_LISTED = ("anyOf", "oneOf", "allOf", "prefixItems")


@dataclass
class SchemaError(ValueError):
    """A schema the engine cannot enforce (or that breaks the strict rules), at ``path``."""

    path: tuple[str | int, ...]
    message: str

    def __str__(self) -> str:
        return f"{self.message} (at {self.where})"

    @property
    def where(self) -> str:
        """The keyword's JSON path, like ``$.properties.tags.uniqueItems``."""
        return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)


def check_schema(schema: Any, *, strict: bool) -> None:
    """Raise ``SchemaError`` for the first keyword that cannot be enforced (or is not strict)."""
    if not isinstance(schema, dict):
        raise SchemaError((), "the schema must be a JSON object")
    if strict and not (schema.get("type") == "object" or "$ref" in schema):
        raise SchemaError(("type",), "with strict, the root schema must be of type 'object'")
    for path, node in _walk(schema, ()):
        for key in node:
            if key in META or key.startswith("x-"):
                continue
            if key not in ENFORCED:
                raise SchemaError((*path, key), f"the keyword '{key}' cannot be enforced")
            if strict and key in NOT_STRICT:
                raise SchemaError((*path, key), f"the keyword '{key}' is not allowed with strict")
        if strict and _is_object(node):
            _check_strict_object(node, path)
        if "pattern" in node or "format" in node:
            _check_alone(node, path)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise SchemaError((), messages[0] if messages else "the schema does not compile")


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` in which every object that does not give ``additionalProperties``
    takes no extra keys (what OpenAI's strict normalization asks; ``required`` is kept as
    given: an optional property stays optional, which the grammar enforces as well)."""
    out = copy.deepcopy(schema)
    for _, node in _walk(out, ()):
        if _is_object(node) and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return out


def best_effort(schema: Any) -> tuple[dict[str, Any], list[str]]:
    """``schema`` without the keywords the engine cannot enforce (and patterns or formats that
    do not compile), with the JSON paths of what was left out. Raises ``SchemaError`` if what
    remains still does not compile (the caller then holds the output to any JSON object)."""
    if not isinstance(schema, dict):
        raise SchemaError((), "the schema must be a JSON object")
    out = copy.deepcopy(schema)
    dropped: list[str] = []
    for path, node in list(_walk(out, ())):
        for key in list(node):
            if key in META or key.startswith("x-"):
                continue
            if key not in ENFORCED:
                dropped.append(SchemaError((*path, key), "").where)
                del node[key]
        for key in ("pattern", "format"):
            if key in node:
                try:
                    _check_alone({key: node[key]}, path)
                except SchemaError as exc:
                    dropped.append(exc.where)
                    del node[key]
    grammar = llguidance.LLMatcher.grammar_from_json_schema(out)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise SchemaError((), messages[0] if messages else "the schema does not compile")
    return out, dropped


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _check_strict_object(node: dict[str, Any], path: tuple[str | int, ...]) -> None:
    if node.get("additionalProperties") is not False:
        raise SchemaError(
            (*path, "additionalProperties"),
            "with strict, 'additionalProperties' must be given and be false",
        )
    properties = node.get("properties", {})
    required = node.get("required", [])
    missing = [k for k in properties if k not in required]
    if missing:
        raise SchemaError(
            (*path, "required"),
            "with strict, 'required' must list every property; missing "
            + ", ".join(repr(k) for k in missing),
        )


def _check_alone(node: dict[str, Any], path: tuple[str | int, ...]) -> None:
    """A string's pattern or format compiled on its own, so an error points at it."""
    for key in ("pattern", "format"):
        if key in node:
            alone = {"type": "string", key: node[key]}
            grammar = llguidance.LLMatcher.grammar_from_json_schema(alone)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
            if is_error:
                raise SchemaError((*path, key), messages[0].splitlines()[-1])


def _walk(
    node: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    if not isinstance(node, dict):
        if isinstance(node, bool):
            return  # true / false schemas
        raise SchemaError(path, "a schema must be an object (or true / false)")
    yield path, node
    for key in ONE:
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], (*path, key))
    for key in MANY_BY_NAME:
        value = node.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield from _walk(sub, (*path, key, name))
    for key in MANY_LISTED:
        value = node.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _walk(sub, (*path, key, i))
