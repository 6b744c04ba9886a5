"""What a request constrains, in terms every family shares: output formats and tool schemas.

``text.format`` (json_object / json_schema) and function tools become JSON schemas here; a
family then places them in its own token grammar (``chat/grammar.py``, ``harmony/grammar.py``).
The rules follow OpenAI's Responses API:

- ``strict: true`` (a tool or a format): the schema must follow the strict rules and use only
  keywords the engine enforces, else a 400 naming the parameter and the keyword's JSON path;
- a function tool without ``strict``: normalized into strict form when it can be (every object
  that does not say otherwise takes no extra keys; optional properties stay optional), and held
  to that; if the schema uses a keyword the engine cannot enforce, best effort instead;
- ``strict: false`` (a tool), or a json_schema format without ``strict: true``: best effort, the
  schema as given with every keyword the engine can enforce enforced and the others left out
  (logged as a warning). Never a 400 for the strict rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from openai.types.responses import FunctionTool

from nbresponses.grammar import SchemaError, best_effort, check_schema, closed
from nbresponses.protocol.errors import bad_request
from nbresponses.protocol.request import CreateRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}
logger = logging.getLogger("nbresponses")

Mode = Literal["strict", "normalized", "best_effort"]


@dataclass(frozen=True)
class ToolSchema:
    name: str
    arguments: dict[str, Any]  # the schema the arguments are held to
    mode: Mode
    dropped: tuple[str, ...] = ()  # keywords (JSON paths) not enforced, in best effort

    @property
    def strict(self) -> bool:
        """The arguments are held to a schema that follows the strict rules."""
        return self.mode != "best_effort"


def output_schema(req: CreateRequest) -> dict[str, Any] | None:
    """The JSON schema the answer must match (None: free text)."""
    fmt = req.text_format
    if fmt is None:
        return None
    if fmt["type"] == "json_object":
        return ANY_OBJECT
    schema = fmt["schema"]
    if not fmt["strict"]:
        return _best_effort(schema, f"response_format '{fmt['name']}'", ANY_VALUE)[0]
    try:
        check_schema(schema, strict=True)
    except SchemaError as exc:
        raise bad_request(
            f"Invalid schema for response_format '{fmt['name']}': {exc.message} (at {exc.where}).",
            param="text.format.schema",
            code="invalid_json_schema",
        ) from None
    return schema


ANY_VALUE: dict[str, Any] = {}  # any JSON value


def _best_effort(
    schema: dict[str, Any], what: str, fallback: dict[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The schema less what cannot be enforced (``fallback`` if even that does not compile)."""
    try:
        enforced, dropped = best_effort(schema)
    except SchemaError as exc:
        logger.warning("%s: the schema cannot be enforced (%s); any JSON is held to", what, exc)
        return fallback, (exc.where,)
    if dropped:
        logger.warning("%s: not enforced (best effort): %s", what, ", ".join(dropped))
    return enforced, tuple(dropped)


def tool_schemas(req: CreateRequest) -> list[ToolSchema]:
    """Each function tool's argument schema, by the rules in the module docstring."""
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
    schema = tool.parameters
    if schema is None:  # a function without parameters takes an empty object
        schema = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    what = f"function '{tool.name}'"
    if tool.strict is True:
        try:
            check_schema(schema, strict=True)
        except SchemaError as exc:
            raise bad_request(
                f"Invalid schema for {what}: {exc.message} (at {exc.where}). "
                "Fix the schema, or leave 'strict' out for best-effort calling.",
                param=f"tools[{index}].parameters",
                code="invalid_function_parameters",
            ) from None
        return ToolSchema(tool.name, schema, "strict")
    if tool.strict is None:
        try:
            normal = closed(schema)
            check_schema(normal, strict=False)
        except SchemaError:
            pass  # a keyword the engine cannot enforce: best effort, below
        else:
            return ToolSchema(tool.name, normal, "normalized")
    arguments, dropped = _best_effort(schema, what, ANY_OBJECT)
    return ToolSchema(tool.name, arguments, "best_effort", dropped)
