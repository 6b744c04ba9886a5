"""Chat Completions (``/v1/chat/completions``): a thin adapter over the Responses request.

``parse_chat`` turns the keywords of ``openai.AsyncOpenAI().chat.completions.create`` (and the
JSON body raw clients post) into a ``ChatRequest``: the chat-only parts (``messages``, the
``{"type": "function", "function": {...}}`` tool shape, ``response_format``, ``n``, ``stop``,
``stream_options``, vLLM's ``echo``) are read here, under chat's own parameter names; the
rest is handed to ``parse_create`` in the Responses API's terms, so each sampling value,
bound, logprob count, seed, tool rule and output format is checked by one definition for
both APIs. An error raised there names the chat parameter the user sent (``CHAT_NAMES``).

The builders make ``openai.types.chat`` objects as OpenAI sends them: ``ChatCompletion``
(message content, ``tool_calls``, ``finish_reason``, Chat's logprobs shape, usage) and
``ChatCompletionChunk``; a reasoning model's thinking is vLLM's ``reasoning_content``.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from openai.resources.chat.completions import AsyncCompletions
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import chat_completion as completion_types
from openai.types.chat import chat_completion_chunk as chunk_types
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails

from nbresponses.protocol.errors import bad_request, unsupported
from nbresponses.protocol.events import TokenLogprob
from nbresponses.protocol.generation import (
    Sampling,
    StreamOptions,
    check_model,
    check_names,
    choice_count,
    logprob_count,
    parse_sampling,
    plain,
    request_body,
    stop_strings,
    stream_options,
)
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.request import LOGPROBS_INCLUDE, CreateRequest, parse_create
from nbresponses.protocol.values import boolean, string

SDK_PARAMETERS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}
# vLLM's extensions (its OpenAI server) that we honour, by vLLM's names, and ours.
EXTENSIONS = frozenset(
    {
        "top_k", "ignore_eos", "prompt_logprobs", "echo", "add_generation_prompt",
        "continue_final_message", "chat_template_kwargs", "logprobs_mode", "repetition_guard",
    }
)  # fmt: skip
# In the SDK, not honoured by a local text model: a 400 naming them.
REJECTED = {
    "audio": "the model reads and writes text only",
    "modalities": "only ['text']",
    "prediction": "predicted outputs are not used",
    "web_search_options": "there is no web search for chat completions",
    "functions": "the deprecated functions API: send 'tools'",
    "function_call": "the deprecated functions API: send 'tool_choice'",
    "moderation": "no moderation runs here",
    "prompt_cache_options": "the prefix cache needs no options",
    "prompt_cache_retention": "the prefix cache needs no options",
    "verbosity": "a local model has no verbosity control",
}
# Accepted with no behaviour to honour: labels (OpenAI keeps them, we echo none of them), and
# ``store``: chat completions are not kept here (nothing to list or retrieve later).
LABELS = ("user", "safety_identifier", "prompt_cache_key", "metadata", "store")
FinishReason = Literal["stop", "length", "tool_calls"]
# Responses parameter names (as parse_create reports them) -> the chat names the user sent.
SCHEMA_FIELDS = r"^text\.format\.(name|schema|strict|description)"
CHAT_NAMES = (
    (re.compile(SCHEMA_FIELDS), r"response_format.json_schema.\1"),
    (re.compile(r"^text\.format"), "response_format"),
    (re.compile(r"^text$"), "response_format"),
    (re.compile(r"^tools\[(\d+)\]\.(?!function)"), r"tools[\1].function."),
    (re.compile(r"^reasoning\.effort"), "reasoning_effort"),
    (re.compile(r"^include.*"), "logprobs"),
)  # fmt: skip


@dataclass
class ChatRequest:
    """A validated chat call: the Responses request each choice runs, and chat's own parts."""

    create: CreateRequest  # store=False, stream=False: the adapter reads the run's events
    sampling: Sampling = field(default_factory=Sampling)  # with top_k and logit_bias
    n: int = 1
    stream: bool = False
    options: StreamOptions = field(default_factory=StreamOptions)
    stop: list[str] = field(default_factory=list)
    echo: bool = False  # vLLM: the last message's content starts the answer
    echo_text: str = ""  # what ``echo`` puts first (the last message's text when assistant)
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None  # vLLM: the rendered prompt's logprobs, top-k each

    @property
    def include_usage(self) -> bool:
        return self.options.include_usage

    def choice_seeds(self) -> list[int | None]:
        """Each choice's seed: the request's with ``n == 1``, else ``derived_seeds(seed, n)``
        (the request core's rule, as ``engine.sample``)."""
        return self.sampling.choice_seeds(self.n)


def parse_chat(kwargs: Mapping[str, Any], *, model: str) -> ChatRequest:
    """Validate ``chat.completions.create`` keywords (SDK names plus vLLM's extensions)."""
    params = request_body(kwargs)
    check_names(params, SDK_PARAMETERS | EXTENSIONS)
    for key in params:
        if key in REJECTED and not (key == "modalities" and params[key] == ["text"]):
            raise unsupported(key, REJECTED[key] + ".")
    check_model(params, model)
    _zero(params, "frequency_penalty", "the engine applies no penalties")
    _zero(params, "presence_penalty", "the engine applies no penalties")
    if params.get("service_tier", "auto") not in ("auto", "default"):
        raise unsupported("service_tier", "only 'auto' or 'default' (there is one tier here).")
    _vllm_template_options(params)
    for key in LABELS:
        if key in params:
            _label(params, key)
    if "messages" not in params:
        raise bad_request("Missing required parameter: 'messages'.", param="messages")
    items = messages_to_input(params["messages"])

    req = ChatRequest(create=CreateRequest(input=[], model=model))
    req.sampling = parse_sampling(params)
    req.stream = boolean(params, "stream", False)
    req.n = choice_count(params)
    req.stop = stop_strings(params)
    req.options = stream_options(params, stream=req.stream)
    req.logprobs = boolean(params, "logprobs", False)
    req.top_logprobs = logprob_count(params, "top_logprobs") or 0
    if req.top_logprobs and not req.logprobs:
        raise bad_request(
            "'top_logprobs' needs logprobs=True (it counts alternatives of each token's logprob).",
            param="top_logprobs",
        )
    req.echo = boolean(params, "echo", False)
    if req.echo:
        req.echo_text = _echo_text(params["messages"])
    if boolean(params, "ignore_eos", False):
        raise unsupported("ignore_eos", "an answer ends at the model's end of turn.")
    req.prompt_logprobs = logprob_count(params, "prompt_logprobs")
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request(
            "'prompt_logprobs' needs stream=False (they come with the whole completion).",
            param="prompt_logprobs",
        )
    req.create = _responses_request(params, items, req, model)
    return req


def _responses_request(
    params: Mapping[str, Any], items: list[dict[str, Any]], req: ChatRequest, model: str
) -> CreateRequest:
    """The Responses request each choice runs, checked by ``parse_create``."""
    create: dict[str, Any] = {"input": items, "store": False}
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if key in params:
            create[key] = params[key]
    limit_name = None
    for name in ("max_completion_tokens", "max_tokens"):  # the first given wins, as OpenAI's
        if name in params:
            limit_name = limit_name or name
            create.setdefault("max_output_tokens", params[name])
    if req.logprobs:
        create["include"] = [LOGPROBS_INCLUDE]
        create["top_logprobs"] = req.top_logprobs
    extra: dict[str, Any] = {}
    for key in ("seed", "logprobs_mode", "repetition_guard"):
        if key in params:
            extra[key] = params[key]
    if "reasoning_effort" in params:
        create["reasoning"] = {"effort": params["reasoning_effort"]}
    if "tools" in params:
        create["tools"] = _tools(params["tools"])
    if "tool_choice" in params:
        create["tool_choice"], create["tools"] = _tool_choice(
            params["tool_choice"], create.get("tools", [])
        )
    if "response_format" in params:
        fmt = _response_format(params["response_format"])
        if fmt is not None:
            create["text"] = {"format": fmt}
    if extra:
        create["extra_body"] = extra
    try:
        return parse_create(create, model=model)
    except openai.BadRequestError as exc:
        raise _renamed(exc, limit_name) from None


def _renamed(exc: openai.BadRequestError, limit_name: str | None) -> openai.BadRequestError:
    """The same error, naming the chat parameter (``max_output_tokens`` -> what was sent)."""
    body = exc.body if isinstance(exc.body, Mapping) else {}
    param = body.get("param")
    message = str(body.get("message", exc.message))
    if isinstance(param, str):
        if param == "max_output_tokens":
            param = limit_name or "max_completion_tokens"
        for pattern, chat in CHAT_NAMES:
            param = pattern.sub(chat, param)
        message = message.replace("'max_output_tokens'", f"'{param}'")
        message = message.replace(f"include=['{LOGPROBS_INCLUDE}']", "logprobs=True")
        message = message.replace("'text.format", "'response_format")
    return bad_request(message, param=param, code=body.get("code"))


# -- messages ---------------------------------------------------------------------------------

ROLES = ("system", "developer", "user", "assistant", "tool")


def messages_to_input(value: Any) -> list[dict[str, Any]]:
    """Chat messages as Responses input items (dicts ``normalize_input`` reads)."""
    if not isinstance(value, list | tuple) or not value:
        raise bad_request("'messages' must be a non-empty list of messages.", param="messages")
    items: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, raw in enumerate(value):
        where = f"messages[{i}]"
        message = _as_dict(raw, where)
        role = message.get("role")
        if role == "function":
            raise unsupported(f"{where}.role", "'function' (deprecated): send 'tool' messages.")
        if role not in ROLES:
            allowed = ", ".join(f"'{r}'" for r in ROLES)
            raise bad_request(
                f"Invalid '{where}.role': {role!r} (one of {allowed}).", param=f"{where}.role"
            )
        _known_keys(message, where, role)
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_request(f"Invalid '{where}.name': expected a string.", param=f"{where}.name")
        if role == "assistant":
            items.extend(_assistant(message, where, calls))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(
                    f"Missing '{where}.tool_call_id': a tool message answers a tool call.",
                    param=f"{where}.tool_call_id",
                )
            if call_id not in calls:
                raise bad_request(
                    f"Invalid '{where}.tool_call_id': no earlier assistant message has a tool "
                    f"call with id '{call_id}'.",
                    param=f"{where}.tool_call_id",
                )
            text = _text(message.get("content"), f"{where}.content", required=True)
            items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        else:
            text = _text(message.get("content"), f"{where}.content", required=True)
            items.append({"type": "message", "role": role, "content": text})
    return items


_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "reasoning_content"},
    "tool": {"role", "content", "tool_call_id"},
}


def _known_keys(message: Mapping[str, Any], where: str, role: str) -> None:
    for key, value in message.items():
        if key in _KEYS[role] or value is None:
            continue
        if key in ("audio", "function_call"):
            raise unsupported(f"{where}.{key}", REJECTED[key] + ".")
        raise bad_request(
            f"Unknown parameter: '{where}.{key}' (a {role} message has "
            f"{', '.join(sorted(_KEYS[role]))}).",
            param=f"{where}.{key}",
            code="unknown_parameter",
        )


def _assistant(message: Mapping[str, Any], where: str, calls: set[str]) -> list[dict[str, Any]]:
    """An assistant turn: its reasoning (vLLM's ``reasoning_content``), text, then calls."""
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise bad_request(
                f"Invalid '{where}.reasoning_content': expected a string.",
                param=f"{where}.reasoning_content",
            )
        if reasoning:
            items.append({"type": "reasoning", "summary": [], "content": [{"text": reasoning}]})
    tool_calls = message.get("tool_calls") or []
    text = _text(message.get("content"), f"{where}.content", required=not tool_calls)
    if text or not tool_calls:
        items.append({"type": "message", "role": "assistant", "content": text})
    if not isinstance(tool_calls, list | tuple):
        raise bad_request(f"'{where}.tool_calls' must be a list.", param=f"{where}.tool_calls")
    for j, raw in enumerate(tool_calls):
        at = f"{where}.tool_calls[{j}]"
        call = _as_dict(raw, at)
        if call.get("type", "function") != "function":
            raise unsupported(f"{at}.type", f"{call.get('type')!r} (function calls only).")
        function = _as_dict(call.get("function"), f"{at}.function")
        call_id = call.get("id")
        name, arguments = function.get("name"), function.get("arguments")
        for key, value in (("id", call_id), ("function.name", name)):
            if not isinstance(value, str) or not value:
                raise bad_request(f"Missing '{at}.{key}': expected a string.", param=f"{at}.{key}")
        if not isinstance(arguments, str):
            raise bad_request(
                f"Invalid '{at}.function.arguments': expected a JSON string.",
                param=f"{at}.function.arguments",
            )
        calls.add(call_id)  # type: ignore[arg-type]
        items.append(
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
        )
    return items


def _text(content: Any, where: str, *, required: bool) -> str:
    """String content, or text parts joined (a refusal part reads as its text)."""
    if content is None:
        if required:
            raise bad_request(f"Missing '{where}': expected a string or text parts.", param=where)
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        raise bad_request(f"'{where}' must be a string or a list of parts.", param=where)
    texts = []
    for j, raw in enumerate(content):
        part = _as_dict(raw, f"{where}[{j}]")
        kind = part.get("type")
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("text", "refusal"):
            raise bad_request(
                f"Unsupported content part type {kind!r} at '{where}[{j}]': the local model "
                "reads text parts only.",
                param=f"{where}[{j}].type",
            )
        if not isinstance(part.get(key), str):
            raise bad_request(
                f"Missing '{where}[{j}].{key}': expected a string.", param=f"{where}[{j}].{key}"
            )
        texts.append(part[key])
    return "".join(texts)


def _echo_text(messages: Sequence[Any]) -> str:
    """vLLM's ``echo``: the last message's content comes first when it is the assistant's."""
    last = _as_dict(messages[-1], f"messages[{len(messages) - 1}]")
    if last.get("role") != "assistant":
        return ""
    return _text(last.get("content"), f"messages[{len(messages) - 1}].content", required=False)


def _as_dict(value: Any, where: str) -> dict[str, Any]:
    value = plain(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise bad_request(f"'{where}' must be an object.", param=where)


# -- tools, tool_choice, response_format -------------------------------------------------------


def _tools(value: Any) -> list[dict[str, Any]]:
    """Chat's ``{"type": "function", "function": {...}}`` as Responses function tools."""
    if not isinstance(value, list | tuple):
        raise bad_request("'tools' must be a list.", param="tools")
    tools = []
    for i, raw in enumerate(value):
        tool = _as_dict(raw, f"tools[{i}]")
        if tool.get("type") != "function":
            raise unsupported(f"tools[{i}].type", f"{tool.get('type')!r} (function tools only).")
        for key in tool:
            if key not in ("type", "function"):
                raise unsupported(f"tools[{i}].{key}")
        function = _as_dict(tool.get("function"), f"tools[{i}].function")
        tools.append({"type": "function", **function})
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """The Responses ``tool_choice`` (and tools: ``allowed_tools`` keeps those it names)."""
    if isinstance(value, str):
        return value, tools
    choice = _as_dict(value, "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        function = _as_dict(choice.get("function"), "tool_choice.function")
        return {"type": "function", "name": function.get("name")}, tools
    if kind == "allowed_tools":
        allowed = _as_dict(choice.get("allowed_tools"), "tool_choice.allowed_tools")
        mode = allowed.get("mode")
        if mode not in ("auto", "required"):
            raise bad_request(
                f"Invalid 'tool_choice.allowed_tools.mode': {mode!r} (use 'auto' or 'required').",
                param="tool_choice.allowed_tools.mode",
            )
        entries = allowed.get("tools")
        if not isinstance(entries, list | tuple) or not entries:
            raise bad_request(
                "'tool_choice.allowed_tools.tools' must be a non-empty list of tools.",
                param="tool_choice.allowed_tools.tools",
            )
        names = set()
        for j, raw in enumerate(entries):
            entry = _as_dict(raw, f"tool_choice.allowed_tools.tools[{j}]")
            named = entry.get("function")
            name = named.get("name") if isinstance(named, Mapping) else entry.get("name")
            if entry.get("type") != "function" or name not in {t.get("name") for t in tools}:
                raise bad_request(
                    f"Invalid 'tool_choice.allowed_tools.tools[{j}]': not a function of 'tools'.",
                    param=f"tool_choice.allowed_tools.tools[{j}]",
                )
            names.add(name)
        return mode, [t for t in tools if t.get("name") in names]
    raise unsupported("tool_choice", f"{value!r} (use 'none', 'auto', 'required' or a function).")


def _response_format(value: Any) -> dict[str, Any] | None:
    """Chat's ``response_format`` as the Responses ``text.format``."""
    fmt = _as_dict(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = _as_dict(fmt.get("json_schema"), "response_format.json_schema")
        return {"type": "json_schema", **schema}
    raise bad_request(
        f"Invalid 'response_format.type': {kind!r} (use 'text', 'json_object' or 'json_schema').",
        param="response_format.type",
    )


# -- chat's own small rules -------------------------------------------------------------------


def _label(params: Mapping[str, Any], key: str) -> None:
    """Labels OpenAI keeps with a completion (none are kept here): their type only."""
    if key == "metadata":
        if not isinstance(params[key], Mapping):
            raise bad_request("Invalid type for 'metadata': expected an object.", param=key)
    elif key == "store":
        boolean(params, key, False)
    else:
        string(params, key)


def _zero(params: Mapping[str, Any], key: str, why: str) -> None:
    if key in params and params[key] != 0:
        raise unsupported(key, f"only 0 ({why}).")


def _vllm_template_options(params: Mapping[str, Any]) -> None:
    """vLLM's template switches we honour: the defaults, and ``enable_thinking`` (read as a
    reasoning effort, which the template's own switch then follows)."""
    if params.get("add_generation_prompt", True) is not True:
        raise unsupported(
            "add_generation_prompt", "only true (the answer is the assistant's next turn)."
        )
    if params.get("continue_final_message", False) is not False:
        raise unsupported(
            "continue_final_message", "only false (an answer starts a new assistant turn)."
        )
    kwargs = params.get("chat_template_kwargs")
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
    for key, value in kwargs.items():
        if key != "enable_thinking":
            raise unsupported(
                f"chat_template_kwargs.{key}",
                "only enable_thinking (send reasoning_effort for the same switch).",
            )
        if not isinstance(value, bool):
            raise bad_request(
                "'chat_template_kwargs.enable_thinking' must be a boolean.",
                param="chat_template_kwargs.enable_thinking",
            )
        if "reasoning_effort" in params:
            raise bad_request(
                "Give either reasoning_effort or chat_template_kwargs.enable_thinking.",
                param="chat_template_kwargs.enable_thinking",
            )
        params["reasoning_effort"] = "medium" if value else "none"  # type: ignore[index]


# -- response shapes ---------------------------------------------------------------------------


def new_chat_id() -> tuple[str, int]:
    """OpenAI's ``chatcmpl-`` ids, and the creation time in seconds."""
    return "chatcmpl-" + new_id("chat").partition("_")[2], int(time.time())


def token_logprob(lp: TokenLogprob) -> ChatCompletionTokenLogprob:
    """One token in Chat's logprobs shape (token, logprob, bytes, top alternatives)."""
    extra: dict[str, Any] = {}
    if lp.processed_logprob is not None:
        extra["processed_logprob"] = lp.processed_logprob
    return ChatCompletionTokenLogprob(
        token=lp.token,
        logprob=lp.logprob,
        bytes=list(lp.bytes),
        top_logprobs=[TopLogprob(token=t, bytes=list(b), logprob=v) for t, b, v in lp.top],
        **extra,
    )


@dataclass
class ToolCall:
    """One function call of a choice as it grows (its index among the choice's calls)."""

    index: int
    id: str
    name: str
    arguments: str = ""


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int
) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
    )


def choice(
    index: int,
    *,
    content: str | None,
    reasoning: str | None,
    calls: Sequence[ToolCall],
    finish_reason: FinishReason,
    logprobs: Sequence[TokenLogprob] | None,
) -> completion_types.Choice:
    """A finished choice: content (None when only calls were made), calls, logprobs."""
    extra: dict[str, Any] = {} if reasoning is None else {"reasoning_content": reasoning}
    message = ChatCompletionMessage(
        role="assistant",
        content=content,
        tool_calls=[
            ChatCompletionMessageFunctionToolCall(
                id=c.id, type="function", function=Function(name=c.name, arguments=c.arguments)
            )
            for c in calls
        ]
        or None,
        **extra,
    )
    return completion_types.Choice(
        index=index,
        message=message,
        finish_reason=finish_reason,
        logprobs=(
            None
            if logprobs is None
            else completion_types.ChoiceLogprobs(
                content=[token_logprob(lp) for lp in logprobs], refusal=None
            )
        ),
    )


def completion(
    chat_id: str,
    created: int,
    model: str,
    choices: list[completion_types.Choice],
    usage: CompletionUsage,
    prompt_logprobs: list[Any] | None = None,
) -> ChatCompletion:
    """The whole completion; vLLM's ``prompt_logprobs`` (per prompt position None or {token id:
    {"logprob", "rank", "decoded_token"}}) is an extra field the SDK's type keeps."""
    extra: dict[str, Any] = {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}
    return ChatCompletion(
        id=chat_id,
        object="chat.completion",
        created=created,
        model=model,
        choices=choices,
        usage=usage,
        system_fingerprint=None,
        **extra,
    )


def delta_choice(
    index: int,
    *,
    role: bool = False,
    content: str | None = None,
    reasoning: str | None = None,
    calls: Sequence[tuple[ToolCall, bool, str]] = (),
    logprobs: Sequence[TokenLogprob] | None = None,
    finish_reason: FinishReason | None = None,
) -> chunk_types.Choice:
    """One choice of a chunk: ``calls`` are (call, first delta of it, argument fragment).

    Only what the delta carries is set (a later tool-call delta has no id, type or name), so
    serialized without unset fields it is what OpenAI sends."""
    fields: dict[str, Any] = {}
    if role:
        fields["role"] = "assistant"
    if content is not None:
        fields["content"] = content
    if reasoning is not None:
        fields["reasoning_content"] = reasoning
    if calls:
        fields["tool_calls"] = [
            _call_delta(call, first, fragment) for call, first, fragment in calls
        ]
    return chunk_types.Choice(
        index=index,
        delta=chunk_types.ChoiceDelta(**fields),
        logprobs=(
            None
            if logprobs is None
            else chunk_types.ChoiceLogprobs(
                content=[token_logprob(lp) for lp in logprobs], refusal=None
            )
        ),
        finish_reason=finish_reason,
    )


def _call_delta(call: ToolCall, first: bool, fragment: str) -> chunk_types.ChoiceDeltaToolCall:
    if not first:
        return chunk_types.ChoiceDeltaToolCall(
            index=call.index, function=chunk_types.ChoiceDeltaToolCallFunction(arguments=fragment)
        )
    return chunk_types.ChoiceDeltaToolCall(
        index=call.index,
        id=call.id,
        type="function",
        function=chunk_types.ChoiceDeltaToolCallFunction(name=call.name, arguments=fragment),
    )


def chunk(
    chat_id: str,
    created: int,
    model: str,
    choices: list[chunk_types.Choice],
    *,
    with_usage: bool = False,
    usage: CompletionUsage | None = None,
) -> ChatCompletionChunk:
    """A chunk; ``with_usage`` (``stream_options.include_usage``): a ``usage`` field on each
    chunk, null but on the last one, as OpenAI sends it."""
    extra: dict[str, Any] = {"usage": usage} if with_usage or usage is not None else {}
    return ChatCompletionChunk(
        id=chat_id,
        object="chat.completion.chunk",
        created=created,
        model=model,
        system_fingerprint=None,
        choices=choices,
        **extra,
    )


def arguments_json(arguments: str) -> bool:
    """Whether a call's arguments are one complete JSON object (a cut call's are not)."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False
