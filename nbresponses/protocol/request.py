"""Validation of ``responses.create`` parameters into a ``CreateRequest``.

Every keyword the openai SDK's ``create`` accepts is either supported here or rejected with a
400 naming it: nothing is silently ignored. Transport knobs: ``extra_body`` is merged into the
parameters exactly as the SDK merges it into the JSON body (so its keys are validated like
any other); ``extra_headers``, ``extra_query`` and ``timeout`` shape an HTTP request, and there
is none in process, so they are accepted and have no effect.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openai.resources.responses import AsyncResponses
from openai.types.responses import FunctionTool, Tool
from openai.types.shared import Reasoning
from pydantic import TypeAdapter, ValidationError

from nbresponses.protocol.errors import bad_request, unsupported
from nbresponses.protocol.generation import (
    TRANSPORT,
    Sampling,
    check_model,
    check_names,
    check_values,
    given,
    logprob_count,
    logprobs_mode,
    parse_sampling,
    plain,
    request_body,
    stream_options,
    token_limit,
)
from nbresponses.protocol.items import InputItem, normalize_input
from nbresponses.protocol.values import boolean, integer, string
from nbresponses.tools import registry
from nbresponses.tools.base import ToolOptionError

SDK_PARAMETERS = frozenset(inspect.signature(AsyncResponses.create).parameters) - {"self"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = (
    LOGPROBS_INCLUDE,
    *(t.answer_include for t in registry.BUILTIN_TOOLS if t.answer_include),
)
TOOL = TypeAdapter(Tool)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")

# Accepted because they are labels echoed on the Response, with no behaviour to honour.
ECHOED = ("user", "safety_identifier", "prompt_cache_key")
# Not in the SDK (sent with ``extra_body``): vLLM's extension parameters that we honour, by
# vLLM's names (``_extensions``), and our repetition_guard (docs/concepts/structured.md).
EXTENSIONS = frozenset({"seed", "logprobs_mode", "repetition_guard"})
# In the SDK, not supported by a local chat-template engine.
REJECTED = frozenset(
    {
        "access_programs", "background_options", "context_management", "conversation", "image",
        "moderation", "prompt", "prompt_cache_options",
        "prompt_cache_retention", "service_tier", "verbosity",
    }
)  # fmt: skip
KNOWN = SDK_PARAMETERS | EXTENSIONS | {"verbosity"}  # (verbosity: known, refused)
STREAM_OPTIONS = frozenset({"include_obfuscation"})  # we never pad: nothing to turn off
__all__ = ["TRANSPORT", "CreateRequest", "check_values", "given", "parse_create", "sampling_of"]


@dataclass
class CreateRequest:
    """A validated create call, normalized."""

    input: list[InputItem]
    model: str
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    logprobs: bool = False
    include: list[str] = field(default_factory=list)
    tools: list[FunctionTool] = field(default_factory=list)
    builtin_tools: list[Tool] = field(default_factory=list)  # code_interpreter, web_search
    all_tools: list[Tool] = field(default_factory=list)  # as given, for the Response
    max_tool_calls: int | None = None
    tool_choice: Any = "auto"
    tool_mode: str = "auto"  # none / auto / required
    forced_tool: str | None = None
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None
    # text.format: None for plain text, else {"type": "json_object"} or the json_schema config
    # ({"type": "json_schema", "name", "schema", "strict", "description"}), as given
    text_format: dict[str, Any] | None = None
    echoed: dict[str, str] = field(default_factory=dict)
    repetition_guard: bool = True
    # extensions (``EXTENSIONS``): the sampler's seed; logprobs of the processed distribution
    seed: int | None = None
    logprobs_mode: str = "raw_logprobs"


def parse_create(kwargs: Mapping[str, Any], *, model: str) -> CreateRequest:
    """Validate ``create`` keywords (SDK names) against what the engine can honour: the
    Responses adapter over the request core (``protocol/generation.py``)."""
    params = request_body(kwargs)
    check_names(params, KNOWN, refused=REJECTED)
    check_model(params, model)
    if "input" not in params:
        raise bad_request("Missing required parameter: 'input'.", param="input")
    req = CreateRequest(input=normalize_input(params["input"]), model=model)
    req.instructions = string(params, "instructions")
    req.stream = boolean(params, "stream", False)
    req.background = boolean(params, "background", False)
    req.store = boolean(params, "store", True)
    if req.background and not req.store:
        raise bad_request("Background responses must be stored: set store=True.", param="store")
    req.previous_response_id = string(params, "previous_response_id")
    req.max_output_tokens = token_limit(params, "max_output_tokens")
    sampling = parse_sampling(params)
    req.temperature, req.top_p, req.seed = sampling.temperature, sampling.top_p, sampling.seed
    req.top_logprobs = logprob_count(params, "top_logprobs") or 0
    req.include = _include(params.get("include", []))
    # top_logprobs > 0 asks for alternatives, which only make sense with the logprobs.
    req.logprobs = LOGPROBS_INCLUDE in req.include or req.top_logprobs > 0
    req.all_tools = _tools(params.get("tools", []))
    req.tools = [t for t in req.all_tools if isinstance(t, FunctionTool)]
    req.builtin_tools = [t for t in req.all_tools if not isinstance(t, FunctionTool)]
    req.max_tool_calls = integer(params, "max_tool_calls", 1, None)
    _tool_choice(req, params.get("tool_choice", "auto"))
    req.parallel_tool_calls = boolean(params, "parallel_tool_calls", True)
    req.metadata = _metadata(params.get("metadata"))
    req.reasoning = _reasoning(params.get("reasoning"))
    req.text_format = _text_config(params.get("text"))
    stream_options(params, stream=req.stream, accepted=STREAM_OPTIONS)
    if params.get("truncation", "disabled") != "disabled":
        raise unsupported("truncation", "only 'disabled' (an over-long prompt is an error).")
    req.echoed = {k: string(params, k) for k in ECHOED if k in params}  # type: ignore[misc]
    req.repetition_guard = boolean(params, "repetition_guard", True)
    req.logprobs_mode = logprobs_mode(
        params,
        logprobs=req.logprobs,
        ask=f"add include=['{LOGPROBS_INCLUDE}'] (or top_logprobs > 0)",
    )
    return req


def sampling_of(req: CreateRequest) -> Sampling:
    """The request's sampling, as the request core reads it (``Sampling.engine_params``)."""
    return Sampling(temperature=req.temperature, top_p=req.top_p, seed=req.seed)


def _include(value: Any) -> list[str]:
    if not isinstance(value, list | tuple):
        raise bad_request("'include' must be a list.", param="include")
    for i, v in enumerate(value):
        if v not in INCLUDABLE:
            allowed = " and ".join(f"'{x}'" for x in INCLUDABLE)
            raise unsupported(f"include[{i}]", f"{v!r} (only {allowed}).")
    return list(value)


def _tools(value: Any) -> list[Tool]:
    """Function tools, plus the built-in tools gpt-oss knows (whether the model does is the
    format's call: a chat-template model rejects them)."""
    if not isinstance(value, list | tuple):
        raise bad_request("'tools' must be a list.", param="tools")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        param = getattr(tool, "param", None)  # a FunctionToolSpec from function_tool()
        tool = param if isinstance(param, Mapping) else tool
        tool = plain(tool)
        kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
        if isinstance(kind, str) and registry.for_request_type(kind) is not None:
            tools.append(_builtin_tool(dict(tool), f"tools[{i}]"))
            continue
        if not isinstance(tool, Mapping) or kind != "function":
            raise unsupported(
                f"tools[{i}]",
                f"tool type {kind!r} (function tools; code_interpreter and web_search with "
                "gpt-oss models).",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"Missing 'tools[{i}].name'.", param=f"tools[{i}].name")
        known = {"type", "name", "description", "parameters", "strict"}
        for key in tool:
            if key not in known and tool[key] is not None:
                raise unsupported(f"tools[{i}].{key}")
        try:
            tools.append(FunctionTool(**{k: tool[k] for k in known if k in tool}))
        except ValidationError as exc:
            where = f"tools[{i}].{'.'.join(map(str, exc.errors()[0]['loc']))}"
            raise bad_request(
                f"Invalid '{where}': {exc.errors()[0]['msg']}.", param=where
            ) from None
    names = [t.name for t in tools if isinstance(t, FunctionTool)]
    if len(set(names)) != len(names):
        raise bad_request("Tool names must be unique.", param="tools")
    kinds = [t.type for t in tools if not isinstance(t, FunctionTool)]
    if len(set(kinds)) != len(kinds):
        raise bad_request("Each built-in tool may be given once.", param="tools")
    return tools


def _builtin_tool(tool: dict[str, Any], where: str) -> Tool:
    """A built-in tool entry, with only the options its local tool honours (``tools/``)."""
    builtin = registry.for_request_type(tool["type"])
    assert builtin is not None
    try:
        tool = builtin.check_request(tool)
    except ToolOptionError as exc:
        raise unsupported(f"{where}.{exc.param}", exc.detail) from None
    try:
        return TOOL.validate_python(tool)
    except ValidationError as exc:
        raise bad_request(f"Invalid '{where}': {exc}", param=where) from None


def _tool_choice(req: CreateRequest, value: Any) -> None:
    value = plain(value)
    req.tool_choice = value
    if value in ("none", "auto", "required"):
        req.tool_mode = value
        if value == "required" and not req.tools:
            raise bad_request(
                "tool_choice 'required' needs at least one tool.", param="tool_choice"
            )
        return
    if isinstance(value, Mapping) and value.get("type") == "function":
        name = value.get("name")
        if name not in {t.name for t in req.tools}:
            raise bad_request(
                f"tool_choice names an unknown function {name!r}.", param="tool_choice"
            )
        req.tool_mode, req.forced_tool = "required", name
        return
    raise unsupported("tool_choice", f"{value!r} (use 'none', 'auto', 'required' or a function).")


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > 16:
        raise bad_request("'metadata' must be a mapping of at most 16 pairs.", param="metadata")
    for k, v in value.items():
        if not isinstance(k, str) or len(k) > 64 or not isinstance(v, str) or len(v) > 512:
            raise bad_request(
                "metadata keys are strings of at most 64 characters and values "
                "strings of at most 512.",
                param="metadata",
            )
    return dict(value)


def _reasoning(value: Any) -> Reasoning | None:
    if value is None:
        return None
    value = plain(value)
    if not isinstance(value, Mapping):
        raise bad_request("'reasoning' must be an object.", param="reasoning")
    for key, v in value.items():
        if key != "effort" and v is not None:
            raise unsupported(f"reasoning.{key}", "reasoning comes back as full reasoning_text.")
    effort = value.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad_request(f"Invalid 'reasoning.effort': {effort!r}.", param="reasoning.effort")
    return Reasoning(effort=effort)


def _text_config(value: Any) -> dict[str, Any] | None:
    """``text``: its ``format`` (plain text, ``json_object`` or ``json_schema``). Whether the
    engine can enforce the schema is the model family's call (``Family.check``)."""
    if value is None:
        return None
    value = plain(value)
    if not isinstance(value, Mapping):
        raise bad_request("'text' must be an object such as {'format': {...}}.", param="text")
    fmt: dict[str, Any] | None = None
    for key, v in value.items():
        if v is None:
            continue
        if key != "format":
            raise unsupported(f"text.{key}", "only 'format' (text, json_object or json_schema).")
        if not isinstance(v, Mapping):
            raise bad_request(
                "'text.format' must be an object such as {'type': 'text'}.", param="text.format"
            )
        fmt = _text_format(v)
    return fmt


def _text_format(value: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = value.get("type")
    known = {
        "text": {"type"},
        "json_object": {"type"},
        "json_schema": {"type", "name", "schema", "strict", "description"},
    }
    if kind not in known:
        raise bad_request(
            f"Invalid 'text.format.type': {kind!r} (use 'text', 'json_object' or 'json_schema').",
            param="text.format.type",
        )
    for key, v in value.items():
        if key not in known[kind] and v is not None:
            raise unsupported(f"text.format.{key}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    name = value.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise bad_request(
            "'text.format.name' must be a string of 1 to 64 characters.",
            param="text.format.name",
        )
    if not all(c.isascii() and (c.isalnum() or c in "_-") for c in name):
        raise bad_request(
            "'text.format.name' may hold only a-z, A-Z, 0-9, underscores and dashes.",
            param="text.format.name",
        )
    schema = value.get("schema")
    if not isinstance(schema, Mapping):
        raise bad_request(
            "Missing 'text.format.schema' (a JSON schema).", param="text.format.schema"
        )
    strict = value.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("'text.format.strict' must be a boolean.", param="text.format.strict")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(
            "'text.format.description' must be a string.", param="text.format.description"
        )
    out: dict[str, Any] = {"type": "json_schema", "name": name, "schema": dict(schema)}
    out["strict"] = bool(strict)  # OpenAI's default for a json_schema format: not strict
    if description is not None:
        out["description"] = description
    return out
