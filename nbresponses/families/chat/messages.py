"""Items to chat messages: the bridge from Responses items to a chat template's input.

Instructions become the first system message; developer messages become system messages.
Consecutive assistant-side items (reasoning, message, function calls) fold into one assistant
turn, as chat templates expect: reasoning text as ``reasoning_content``, calls as
``tool_calls``. Each ``function_call_output`` becomes a ``tool`` message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
    ResponseOutputMessage,
    ResponseReasoningItem,
)


def to_chat(items: Iterable[Any], instructions: str | None) -> list[dict[str, Any]]:
    """Chat-template messages for a conversation (input items and earlier outputs)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    turn: dict[str, Any] | None = None  # the assistant turn being assembled

    def assistant() -> dict[str, Any]:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            messages.append(turn)
        return turn

    for item in items:
        if isinstance(item, ResponseInputMessageItem):
            turn = None
            role = "system" if item.role == "developer" else item.role
            text = "".join(getattr(p, "text", "") for p in item.content)
            messages.append({"role": role, "content": text})
        elif isinstance(item, ResponseOutputMessage):
            t = assistant()
            parts = item.content
            text = "".join(
                getattr(p, "text", None) or getattr(p, "refusal", None) or "" for p in parts
            )
            t["content"] = f"{t['content']}\n{text}" if t["content"] else text
        elif isinstance(item, ResponseReasoningItem):
            t = assistant()
            text = "".join(c.text for c in item.content or []) or "".join(
                s.text for s in item.summary
            )
            t["reasoning_content"] = (t.get("reasoning_content", "") + text).strip()
        elif isinstance(item, ResponseFunctionToolCall | ResponseFunctionToolCallItem):
            t = assistant()
            t.setdefault("tool_calls", []).append(
                {"id": item.call_id, "name": item.name, "arguments": item.arguments}
            )
        elif isinstance(item, ResponseFunctionToolCallOutputItem):
            turn = None
            output = (
                item.output
                if isinstance(item.output, str)
                else "".join(getattr(p, "text", "") for p in item.output)
            )
            messages.append({"role": "tool", "content": output, "tool_call_id": item.call_id})
    return messages
