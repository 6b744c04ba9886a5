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

import openai
from openai.resources.responses import AsyncResponses
from openai.types.responses import FunctionTool, Tool
from openai.types.shared import Reasoning
from pydantic import TypeAdapter, ValidationError

from nbresponses.protocol.errors import bad_request, not_found, unsupported
from nbresponses.protocol.items import InputItem, normalize_input
from nbresponses.protocol.values import integer, number
from nbresponses.tools import registry
from nbresponses.tools.base import ToolOptionError

TRANSPORT = ("extra_headers", "extra_query", "timeout")
SDK_PARAMETERS = frozenset(inspect.signature(AsyncResponses.create).parameters) - {"self"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = (
    LOGPROBS_INCLUDE,
    *(t.answer_include for t in registry.BUILTIN_TOOLS if t.answer_include),
)
TOOL = TypeAdapter(Tool)
MAX_DEPTH = 100  # levels of nesting in any parameter (a JSON schema needs far fewer)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")

# Accepted because they are labels echoed on the Response, with no behaviour to honour.
ECHOED = ("user", "safety_identifier", "prompt_cache_key")
# Not in the SDK (sent with ``extra_body``): vLLM's extension parameters that we honour, by
# vLLM's names (``_extensions``), and our repetition_guard (docs/concepts/structured.md).
EXTENSIONS = frozenset({"seed", "logprobs_mode", "repetition_guard"})
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
INT64 = (-(2**63), 2**63 - 1)  # vLLM's bounds for ``seed``
# In the SDK, not supported by a local chat-template engine.
REJECTED = frozenset(
    {
        "access_programs", "background_options", "context_management", "conversation", "image",
        "moderation", "prompt", "prompt_cache_options",
        "prompt_cache_retention", "service_tier", "verbosity",
    }
)  # fmt: skip


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


def given(value: Any) -> bool:
    """False for None and the SDK's NOT_GIVEN / omit sentinels."""
    return value is not None and not isinstance(value, openai.NotGiven | openai.Omit)


def parse_create(kwargs: Mapping[str, Any], *, model: str) -> CreateRequest:
    """Validate ``create`` keywords (SDK names) against what the engine can honour."""
    params = {k: v for k, v in kwargs.items() if k not in TRANSPORT and k != "extra_body"}
    extra = kwargs.get("extra_body")
    if given(extra):
        if not isinstance(extra, Mapping):
            raise bad_request("'extra_body' must be a mapping.", param="extra_body")
        params.update(extra)
    params = {k: v for k, v in params.items() if given(v)}
    check_values(params)
    for key in params:
        if key not in SDK_PARAMETERS and key != "verbosity" and key not in EXTENSIONS:
            raise bad_request(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
        if key in REJECTED:
            raise unsupported(key)
    if "model" in params and params["model"] != model:
        raise not_found(
            f"The model '{params['model']}' does not exist here; this client serves '{model}'.",
            param="model",
            code="model_not_found",
        )
    if "input" not in params:
        raise bad_request("Missing required parameter: 'input'.", param="input")
    req = CreateRequest(input=normalize_input(params["input"]), model=model)
    req.instructions = _opt_str(params, "instructions")
    req.stream = _bool(params, "stream", False)
    req.background = _bool(params, "background", False)
    req.store = _bool(params, "store", True)
    if req.background and not req.store:
        raise bad_request("Background responses must be stored: set store=True.", param="store")
    req.previous_response_id = _opt_str(params, "previous_response_id")
    req.max_output_tokens = integer(params, "max_output_tokens", 1, None)
    req.temperature = number(params, "temperature", 0.0, 2.0, 1.0)
    req.top_p = number(params, "top_p", 0.0, 1.0, 1.0)
    req.top_logprobs = integer(params, "top_logprobs", 0, 20) or 0
    req.include = _include(params.get("include", []))
    # top_logprobs > 0 asks for alternatives, which only make sense with the logprobs.
    req.logprobs = LOGPROBS_INCLUDE in req.include or req.top_logprobs > 0
    req.all_tools = _tools(params.get("tools", []))
    req.tools = [t for t in req.all_tools if isinstance(t, FunctionTool)]
    req.builtin_tools = [t for t in req.all_tools if not isinstance(t, FunctionTool)]
    req.max_tool_calls = integer(params, "max_tool_calls", 1, None)
    _tool_choice(req, params.get("tool_choice", "auto"))
    req.parallel_tool_calls = _bool(params, "parallel_tool_calls", True)
    req.metadata = _metadata(params.get("metadata"))
    req.reasoning = _reasoning(params.get("reasoning"))
    req.text_format = _text_config(params.get("text"))
    _stream_options(params.get("stream_options"), req.stream)
    if params.get("truncation", "disabled") != "disabled":
        raise unsupported("truncation", "only 'disabled' (an over-long prompt is an error).")
    req.echoed = {k: _opt_str(params, k) for k in ECHOED if k in params}  # type: ignore[misc]
    req.repetition_guard = _bool(params, "repetition_guard", True)
    _extensions(req, params)
    return req


def _extensions(req: CreateRequest, params: Mapping[str, Any]) -> None:
    """vLLM's sampling extensions, with vLLM's names and types: ``seed`` (any int64; the
    same seed gives the same tokens alone, batched, streamed or not) and ``logprobs_mode``
    ("raw_logprobs", the default, or "processed_logprobs": each token's logprob under the
    distribution it was drawn from is reported beside the raw one)."""
    req.seed = integer(params, "seed", *INT64)
    mode = params.get("logprobs_mode", "raw_logprobs")
    if mode not in LOGPROBS_MODES:
        allowed = " or ".join(f"'{m}'" for m in LOGPROBS_MODES)
        raise bad_request(
            f"Invalid 'logprobs_mode': {mode!r}; it must be {allowed} (logits are not reported).",
            param="logprobs_mode",
        )
    if mode != "raw_logprobs" and not req.logprobs:
        raise bad_request(
            f"logprobs_mode '{mode}' needs logprobs: add "
            f"include=['{LOGPROBS_INCLUDE}'] (or top_logprobs > 0).",
            param="logprobs_mode",
        )
    req.logprobs_mode = mode


def check_values(params: Mapping[str, Any]) -> None:
    """Walk every value (without recursion, so depth cannot overflow the stack): a 400 naming
    the path of a string that is not valid Unicode (a lone surrogate such as ``"\\ud800"``,
    which JSON allows and no tokenizer can encode), or of nesting deeper than ``MAX_DEPTH``."""
    stack: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in params.items()]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise bad_request(
                        f"Invalid '{path}': the string holds a lone surrogate (invalid Unicode); "
                        "send UTF-8 text.",
                        param=path,
                    ) from None
            continue
        if depth > MAX_DEPTH and isinstance(value, Mapping | list | tuple):
            raise bad_request(
                f"Invalid '{path.split('.')[0].split('[')[0]}': nested more than {MAX_DEPTH} "
                "levels deep.",
                param=path.split(".")[0].split("[")[0],
            )
        if isinstance(value, Mapping):
            for key, item in value.items():
                stack.append((f"{path}.{key}", key, depth + 1))  # keys are strings too
                stack.append((f"{path}.{key}", item, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))


def _opt_str(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"Invalid type for '{key}': expected a string.", param=key)
    return value


def _bool(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise bad_request(f"Invalid type for '{key}': expected a boolean.", param=key)
    return value


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
        tool = (
            tool.model_dump(exclude_none=True, by_alias=True)
            if hasattr(tool, "model_dump")
            else tool
        )
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
    value = (
        value.model_dump(exclude_none=True, by_alias=True)
        if hasattr(value, "model_dump")
        else value
    )
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
    value = (
        value.model_dump(exclude_none=True, by_alias=True)
        if hasattr(value, "model_dump")
        else value
    )
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
    value = (
        value.model_dump(exclude_none=True, by_alias=True)
        if hasattr(value, "model_dump")
        else value
    )
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


def _stream_options(value: Any, stream: bool) -> None:
    if value is None:
        return
    if not stream:
        raise bad_request("'stream_options' needs stream=True.", param="stream_options")
    value = (
        value.model_dump(exclude_none=True, by_alias=True)
        if hasattr(value, "model_dump")
        else value
    )
    if not isinstance(value, Mapping):
        raise bad_request(
            "'stream_options' must be an object such as {'include_obfuscation': False}.",
            param="stream_options",
        )
    for key, v in value.items():
        if key != "include_obfuscation":  # we never add obfuscation padding: nothing to turn off
            raise unsupported(f"stream_options.{key}")
        if not isinstance(v, bool):
            raise bad_request(
                "'stream_options.include_obfuscation' must be a boolean.",
                param="stream_options.include_obfuscation",
            )
