"""Responses-style requests → harmony conversations → prompt token ids for gpt-oss.

The layout follows harmony's rules:

* one **system** message: model identity, knowledge cutoff, current date, reasoning effort,
  the valid channels, and the built-in tools the request enables (``tools/registry.py``);
* one **developer** message, when there is anything to say: ``instructions`` (plus the text of
  leading system/developer input messages) and the function tools as a ``functions`` namespace;
* the conversation: user messages; assistant messages on ``final`` (``commentary`` for messages
  whose ``phase`` is "commentary"); ``reasoning`` items on ``analysis``; ``function_call`` items as
  commentary messages to ``functions.NAME`` with content type ``<|constrain|>json``;
  ``function_call_output`` items as tool messages from ``functions.NAME``;
  built-in tool items as their tool replays them (``BuiltinTool.replay``: a
  ``code_interpreter_call`` is an analysis message to ``python`` and its logs python's answer).

**Chain of thought of earlier turns is dropped**: every ``analysis`` message before the last
assistant ``final`` message is left out, as the harmony guide asks (the model never saw its old
reasoning during training). Analysis after the last final (the turn in progress, e.g. reasoning
before a function call whose output is now being sent) is kept. harmony's own
``auto_drop_analysis`` drops only analysis before the *first* final, so we filter ourselves and
render with it off.

Other choices: a system/developer input message after the first non-system item becomes a
developer message in place; ``web_search_call`` items are not replayed (their results are not
stored in the item; the answer that used them is); images and files raise (gpt-oss reads text).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from openai_harmony import (
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from nbresponses.tools import registry
from nbresponses.tools.base import tool_message

KNOWLEDGE_CUTOFF = "2024-06"
JSON_CONTENT_TYPE = "<|constrain|>json"

_EFFORT = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    "xhigh": ReasoningEffort.HIGH,
}
_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


@dataclass(frozen=True)
class HarmonyPrompt:
    """What the engine needs to generate the next assistant turn."""

    conversation: Conversation
    token_ids: list[int]
    stop_token_ids: tuple[int, ...]  # <|return|> and <|call|>
    builtin: tuple[str, ...]  # the built-in tools the system message describes ("python")
    function_names: tuple[str, ...]


def _as_dict(value: Any) -> dict[str, Any]:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"expected a dict or an openai model, got {type(value).__name__}")


def _text(content: Any) -> str:
    """The text of a message's content (string or parts); images and files raise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part = _as_dict(part)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(part.get("text", ""))
        elif kind == "refusal":
            texts.append(part.get("refusal", ""))
        else:
            raise ValueError(f"gpt-oss models read text only; cannot render a {kind!r} part")
    return "".join(texts)


def _effort(reasoning: Any) -> ReasoningEffort:
    if reasoning is None:
        return ReasoningEffort.MEDIUM
    effort = _as_dict(reasoning).get("effort")
    if effort is None:
        return ReasoningEffort.MEDIUM
    try:
        return _EFFORT[str(effort).lower()]
    except KeyError:
        raise ValueError(f"unknown reasoning effort {effort!r}") from None


def function_tools(tools: Iterable[Any]) -> list[ToolDescription]:
    """Responses function tools as harmony tool descriptions (other tool types are skipped)."""
    out = []
    for tool in tools:
        tool = _as_dict(tool)
        if tool.get("type") != "function":
            continue
        fn = tool.get("function", tool)  # also accept the chat-completions shape
        out.append(
            ToolDescription.new(fn["name"], fn.get("description") or "", fn.get("parameters"))
        )
    return out


def builtin_namespaces(tools: Iterable[Any], **settings: Any) -> list[ToolNamespaceConfig]:
    """How the built-in tools a request's ``tools`` enable are described to the model."""
    kinds = {_as_dict(t).get("type") for t in tools}
    return [
        tool.namespace(**settings)
        for tool in registry.BUILTIN_TOOLS
        if any(kind in tool.request_types for kind in kinds)
    ]


def system_message(
    *,
    effort: ReasoningEffort,
    today: date,
    knowledge_cutoff: str,
    builtin: Sequence[ToolNamespaceConfig] = (),
    model_identity: str | None = None,
) -> Message:
    content = (
        SystemContent.new()
        .with_reasoning_effort(effort)
        .with_conversation_start_date(today.isoformat())
        .with_knowledge_cutoff(knowledge_cutoff)
        .with_required_channels(["analysis", "commentary", "final"])
    )
    if model_identity is not None:
        content = content.with_model_identity(model_identity)
    for namespace in builtin:
        content = content.with_tools(namespace)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


class _Conversation:
    """Input items → harmony messages, remembering call names for their outputs."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.leading_instructions: list[str] = []
        self._call_names: dict[str, str] = {}

    def add(self, item: dict[str, Any]) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item)
        elif kind == "function_call":
            self._call_names[item["call_id"]] = item["name"]
            self.messages.append(
                _assistant(item.get("arguments", ""), "commentary")
                .with_recipient(f"functions.{item['name']}")
                .with_content_type(JSON_CONTENT_TYPE)
            )
        elif kind == "function_call_output":
            name = self._call_names.get(item["call_id"])
            if name is None:
                raise ValueError(
                    f"function_call_output {item['call_id']!r} has no function_call before it"
                )
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output)
            message = tool_message(f"functions.{name}", text, channel="commentary")
            self.messages.append(message)
        elif kind == "reasoning":
            text = _text(item.get("content")) or "\n".join(
                _text([s]) for s in item.get("summary", [])
            )
            if text:
                self.messages.append(_assistant(text, "analysis"))
        elif registry.for_item_type(kind) is not None:
            tool = registry.for_item_type(kind)
            assert tool is not None
            self.messages.extend(tool.replay(item))  # a web search replays nothing
        elif kind == "item_reference":
            raise ValueError("resolve item_reference items before rendering a harmony prompt")
        else:
            raise ValueError(f"cannot render a {kind!r} item for a gpt-oss model")

    def _message(self, item: dict[str, Any]) -> None:
        role = item.get("role")
        text = _text(item.get("content"))
        if role in ("system", "developer"):
            if not self.messages:
                self.leading_instructions.append(text)
            else:
                self.messages.append(Message.from_role_and_content(Role.DEVELOPER, text))
        elif role == "user":
            self.messages.append(Message.from_role_and_content(Role.USER, text))
        elif role == "assistant":
            channel = "commentary" if item.get("phase") == "commentary" else "final"
            self.messages.append(_assistant(text, channel))
        else:
            raise ValueError(f"unknown message role {role!r}")


def drop_old_analysis(messages: Sequence[Message]) -> list[Message]:
    """Leave out analysis before the last assistant final message (see the module docstring)."""
    last_final = max(
        (
            i
            for i, m in enumerate(messages)
            if m.author.role == Role.ASSISTANT and m.channel == "final"
        ),
        default=-1,
    )
    return [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]


def build_conversation(
    input: str | Sequence[Any],
    *,
    instructions: str | None = None,
    tools: Sequence[Any] = (),
    reasoning: Any = None,
    builtin: Sequence[ToolNamespaceConfig] | None = None,
    today: date | None = None,
    knowledge_cutoff: str = KNOWLEDGE_CUTOFF,
    model_identity: str | None = None,
    response_format: str | None = None,
) -> Conversation:
    """The harmony conversation for a request (no tokens yet).

    ``builtin`` (the namespaces of the built-in tools to describe) defaults to those the
    built-in tools in ``tools`` enable, with default settings (``builtin_namespaces``).
    ``response_format`` is a ``# Response Formats`` section, placed at the end of the
    developer message as the harmony guide asks (openai-harmony has no field for it).
    """
    conversation = _Conversation()
    items = [{"role": "user", "content": input}] if isinstance(input, str) else input
    for item in items:
        conversation.add(_as_dict(item))
    if builtin is None:
        builtin = builtin_namespaces(tools)
    messages = [
        system_message(
            effort=_effort(reasoning),
            today=today or date.today(),
            knowledge_cutoff=knowledge_cutoff,
            builtin=builtin,
            model_identity=model_identity,
        )
    ]
    parts = [t for t in (instructions, *conversation.leading_instructions) if t]
    functions = function_tools(tools)
    if parts or functions:
        developer = DeveloperContent.new()
        if parts:
            developer = developer.with_instructions("\n\n".join(parts))
        if functions:
            developer = developer.with_function_tools(functions)
        message = Message.from_role_and_content(Role.DEVELOPER, developer)
        if response_format:
            message = message.adding_content(TextContent(text="\n\n" + response_format))
        messages.append(message)
    elif response_format:
        messages.append(Message.from_role_and_content(Role.DEVELOPER, response_format))
    messages.extend(drop_old_analysis(conversation.messages))
    return Conversation.from_messages(messages)


def render_request(
    encoding: HarmonyEncoding, input: str | Sequence[Any], **options: Any
) -> HarmonyPrompt:
    """Prompt ids for the next assistant turn (ending ``<|start|>assistant``), and stop ids.

    ``options`` are those of ``build_conversation``.
    """
    conversation = build_conversation(input, **options)
    ids = encoding.render_conversation_for_completion(
        conversation, Role.ASSISTANT, RenderConversationConfig(auto_drop_analysis=False)
    )
    system = conversation.messages[0].content[0]
    builtin = tuple(getattr(system, "tools", None) or {})  # the namespaces it describes
    names = tuple(t.name for t in function_tools(options.get("tools", ())))
    return HarmonyPrompt(
        conversation=conversation,
        token_ids=list(ids),
        stop_token_ids=tuple(encoding.stop_tokens_for_assistant_actions()),
        builtin=builtin,
        function_names=names,
    )


def continuation_ids(encoding: HarmonyEncoding, tool_message: Message) -> list[int]:
    """Tokens to append after a ``<|call|>`` to send a tool's answer and let the model go on.

    prompt + generated + these is a valid harmony prompt (the tool loop's fast path: no
    re-render, so the engine can reuse the KV cache of everything before).
    """
    return [
        *encoding.render(tool_message),
        *encoding.encode("<|start|>assistant", allowed_special={"<|start|>"}),
    ]
