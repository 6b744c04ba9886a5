"""Input normalization: what a user passes as ``input`` becomes typed, id-carrying items.

Accepted: a string (one user message); or a list of items given as dicts or SDK models:
messages (roles user / system / developer / assistant; string content or ``input_text`` /
``output_text`` parts; an assistant ``phase`` is kept), ``function_call``,
``function_call_output`` and ``reasoning`` items (with or without id / status), and the
built-in tool items of gpt-oss models, ``code_interpreter_call`` and ``web_search_call``
(which model can read them is the family's call, see ``families/``). Items keep their id
when they have one; others get one, so ``input_items.list`` can page them like OpenAI does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from openai.types.responses import (
    ResponseCodeInterpreterToolCall,
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseFunctionWebSearch,
    ResponseInputMessageItem,
    ResponseInputText,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Content, Summary

from nbresponses.protocol.errors import bad_request
from nbresponses.protocol.ids import new_id
from nbresponses.tools import registry

InputItem = (
    ResponseInputMessageItem
    | ResponseOutputMessage
    | ResponseFunctionToolCallItem
    | ResponseFunctionToolCallOutputItem
    | ResponseReasoningItem
    | ResponseCodeInterpreterToolCall
    | ResponseFunctionWebSearch
)
BUILTIN_ITEMS = registry.item_types()  # code_interpreter_call, web_search_call

_TEXT_PARTS = ("input_text", "output_text", "text")


def normalize_input(value: Any) -> list[InputItem]:
    """Turn ``input`` into items; a malformed item is a 400 naming its path."""
    if isinstance(value, str):
        return [_message("user", value, None, "input")]
    if not isinstance(value, list | tuple):
        raise bad_request("'input' must be a string or a list of items.", param="input")
    return [_checked_item(_as_dict(v, f"input[{i}]"), f"input[{i}]") for i, v in enumerate(value)]


def _checked_item(item: dict[str, Any], where: str) -> InputItem:
    """``_item``, with a field of the wrong type (an ``id`` that is a list...) as a 400."""
    try:
        return _item(item, where)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join([where, *(str(part) for part in first["loc"])])
        raise bad_request(f"Invalid '{path}': {first['msg']}.", param=path) from None


def check_call_outputs(context: list[Any], items: list[InputItem]) -> None:
    """Every ``function_call_output`` in ``input`` answers a ``function_call`` made before it,
    in the earlier turns (``context``) or in ``input``; OpenAI answers a 400 otherwise."""
    calls = {item.call_id for item in context if getattr(item, "type", None) == "function_call"}
    for i, item in enumerate(items):
        if isinstance(item, ResponseFunctionToolCallItem):
            calls.add(item.call_id)
        elif isinstance(item, ResponseFunctionToolCallOutputItem) and item.call_id not in calls:
            raise bad_request(
                f"No tool call found for function call output with call_id '{item.call_id}'.",
                param=f"input[{i}].call_id",
            )


def _as_dict(value: Any, where: str) -> dict[str, Any]:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True, by_alias=True)
    if isinstance(value, Mapping):
        return dict(value)
    raise bad_request(f"'{where}' must be an object.", param=where)


def _required_str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(
            f"Missing or invalid '{where}.{key}': expected a string.", param=f"{where}.{key}"
        )
    return value


def _item(item: dict[str, Any], where: str) -> InputItem:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise bad_request(f"Invalid '{where}.role': {role!r}.", param=f"{where}.role")
        text = _text(item.get("content"), f"{where}.content")
        message = _message(role, text, item.get("id"), where)
        if role == "assistant" and item.get("phase") is not None:
            if item["phase"] not in ("commentary", "final_answer"):
                raise bad_request(f"Invalid '{where}.phase'.", param=f"{where}.phase")
            message.phase = item["phase"]  # type: ignore[union-attr]
        return message
    if kind == "function_call":
        return ResponseFunctionToolCallItem(
            type="function_call",
            id=item.get("id") or new_id("fc"),
            call_id=_required_str(item, "call_id", where),
            name=_required_str(item, "name", where),
            arguments=_required_str(item, "arguments", where),
            status=item.get("status") or "completed",
        )
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        return ResponseFunctionToolCallOutputItem(
            type="function_call_output",
            id=item.get("id") or new_id("fco"),
            call_id=_required_str(item, "call_id", where),
            output=text,
            status=item.get("status") or "completed",
        )
    if kind == "reasoning":
        content = [
            Content(type="reasoning_text", text=_required_str(c, "text", f"{where}.content[{j}]"))
            for j, c in enumerate(_parts(item, "content", where))
        ]
        summary = [
            Summary(type="summary_text", text=_required_str(s, "text", f"{where}.summary[{j}]"))
            for j, s in enumerate(_parts(item, "summary", where))
        ]
        if item.get("encrypted_content"):
            raise bad_request(
                "Encrypted reasoning content cannot be read by a local model.",
                param=f"{where}.encrypted_content",
            )
        return ResponseReasoningItem(
            type="reasoning",
            id=item.get("id") or new_id("rs"),
            summary=summary,
            content=content,
            status=item.get("status"),
        )
    tool = registry.for_item_type(kind) if isinstance(kind, str) else None
    if tool is not None:
        try:
            return tool.item_class.model_validate(  # type: ignore[return-value]
                {"id": new_id(tool.id_prefix), "status": "completed", **item, "type": kind}
            )
        except pydantic.ValidationError as exc:
            raise bad_request(f"Invalid {kind} item at '{where}': {exc}", param=where) from None
    raise bad_request(
        f"Unsupported input item type {kind!r} at '{where}': nbresponses accepts message, "
        f"function_call, function_call_output, reasoning and {' and '.join(BUILTIN_ITEMS)} "
        "items.",
        param=f"{where}.type",
    )


def _parts(item: Mapping[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """A list of objects (a reasoning item's ``content`` or ``summary``); absent: none."""
    value = item.get(key)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise bad_request(f"'{where}.{key}' must be a list.", param=f"{where}.{key}")
    return [_as_dict(part, f"{where}.{key}[{j}]") for j, part in enumerate(value)]


def _text(content: Any, where: str) -> str:
    """The text of string content or of a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        raise bad_request(f"'{where}' must be a string or a list of parts.", param=where)
    texts = []
    for j, part in enumerate(content):
        part = _as_dict(part, f"{where}[{j}]")
        if part.get("type") not in _TEXT_PARTS:
            raise bad_request(
                f"Unsupported content part type {part.get('type')!r} at '{where}[{j}]': "
                "the local model reads text parts only.",
                param=f"{where}[{j}].type",
            )
        texts.append(_required_str(part, "text", f"{where}[{j}]"))
    return "".join(texts)


def _message(role: str, text: str, item_id: str | None, where: str) -> InputItem:
    if role == "assistant":
        return ResponseOutputMessage(
            type="message",
            id=item_id or new_id("msg"),
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
    return ResponseInputMessageItem(
        type="message",
        id=item_id or new_id("msg"),
        role=role,  # type: ignore[arg-type]
        status="completed",
        content=[ResponseInputText(type="input_text", text=text)],
    )
