"""What a request constrains, in terms every family shares: output formats and tool schemas.

``text.format`` (json_object / json_schema) and function tools become JSON schemas here, checked
against what the grammar engine enforces; a family then places them in its own token grammar
(``chat/grammar.py``, ``harmony/grammar.py``). A schema feature that cannot be enforced is a 400
naming the parameter and the feature's JSON path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai.types.responses import FunctionTool

from nbresponses.grammar import SchemaError, check_schema
from nbresponses.protocol.errors import bad_request
from nbresponses.protocol.request import CreateRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolSchema:
    name: str
    arguments: dict[str, Any]  # the schema the arguments are held to
    strict: bool


def output_schema(req: CreateRequest) -> dict[str, Any] | None:
    """The JSON schema the answer must match (None: free text)."""
    fmt = req.text_format
    if fmt is None:
        return None
    if fmt["type"] == "json_object":
        return ANY_OBJECT
    schema = fmt["schema"]
    try:
        check_schema(schema, strict=fmt["strict"])
    except SchemaError as exc:
        raise bad_request(
            f"Invalid schema for response_format '{fmt['name']}': {exc.message} (at {exc.where}).",
            param="text.format.schema",
            code="invalid_json_schema",
        ) from None
    return schema


def tool_schemas(req: CreateRequest) -> list[ToolSchema]:
    """Each function tool's argument schema. ``strict`` defaults to true, as on OpenAI's
    Responses API: the schema must then follow the strict rules and is enforced; a tool with
    ``strict: false`` gets arguments that are a JSON object, its schema is a hint."""
    out = []
    for i, tool in enumerate(req.tools):
        out.append(_tool_schema(tool, _index(req, tool, i)))
    return out


def _index(req: CreateRequest, tool: FunctionTool, fallback: int) -> int:
    for i, t in enumerate(req.all_tools):
        if t is tool:
            return i
    return fallback


def _tool_schema(tool: FunctionTool, index: int) -> ToolSchema:
    strict = tool.strict is not False
    schema = tool.parameters if tool.parameters is not None else None
    if not strict:
        return ToolSchema(tool.name, ANY_OBJECT, False)
    if schema is None:
        schema = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    try:
        check_schema(schema, strict=True)
    except SchemaError as exc:
        raise bad_request(
            f"Invalid schema for function '{tool.name}': {exc.message} (at {exc.where}). "
            "Fix the schema or set 'strict': false.",
            param=f"tools[{index}].parameters",
            code="invalid_function_parameters",
        ) from None
    return ToolSchema(tool.name, schema, True)
