"""Chat-template rendering: neutral chat messages + function tools in, prompt token ids out.

The messages are Hugging Face chat dicts (``role``, ``content``, and for assistants
``tool_calls`` / ``reasoning_content``, for tool results ``tool_call_id``). Templates differ in
what they understand, so ``TemplateCapabilities`` is read from the template source and the
rendering adapts:

* Templates that take ``tools`` get them (and tool calls / tool messages) natively.
* Templates that ignore tools (SmolLM2's) get a Hermes-style tool system prompt injected by us
  (appended to the first system message, or as a new one), past calls rendered as
  ``<tool_call>`` blocks in the assistant turn and results as ``<tool_response>`` user turns:
  the format Qwen2.5 / Hermes models were trained on and that the parser reads back.
* Templates that take tools but do not render past ``tool_calls`` (SmolLM3's) get those calls
  as Hermes ``<tool_call>`` blocks in the assistant's content, so the model sees what it called.
* ``reasoning_content`` is passed only to templates that use it (Qwen3's, which keeps it for
  the turns after the last user message); otherwise past reasoning is dropped from the prompt
  (what thinking models' own templates do with earlier turns: R1's and SmolLM3's drop it).
* ``reasoning.effort`` becomes the template's switch (``reasoning``); where the prompt leaves
  the reasoning is read back from the rendered text (``Prompt.start``): a prompt that already
  opens ``<think>`` (R1 distills) makes that text the parser's prefill.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import TemplateError

from nbresponses.families.chat.capabilities import TemplateCapabilities
from nbresponses.families.chat.parser import THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN
from nbresponses.families.chat.reasoning import (
    ThinkStart,
    contradiction,
    effort_kwargs,
    overridden,
    think_start,
)
from nbresponses.protocol.errors import unsupported
from nbresponses.tokens.contract import Tokenizer

__all__ = ["Prompt", "TemplateCapabilities", "render", "tool_schema"]

ToolMode = Literal["none", "auto", "required"]

HERMES_TOOL_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, its ids, the assistant text it already contains, and where
    it leaves the reasoning (``reasoning.ThinkStart``)."""

    text: str
    ids: list[int]
    prefill: str
    start: ThinkStart = "free"

    @property
    def lead(self) -> str:
        """What the parser and grammar take as already written before the first token: the
        prefill, or ``<think>`` when the model starts inside its reasoning untagged."""
        return self.prefill or (THINK_OPEN if self.start == "implicit" else "")


def tool_schema(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict:
    """One function in the chat-template (OpenAI chat completions) shape."""
    function: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object"}}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def render(
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] = (),
    tool_mode: ToolMode = "auto",
    forced_tool: str | None = None,
    reasoning_effort: str | None = None,
) -> Prompt:
    """Render a conversation ready for the assistant's next turn.

    ``tool_mode`` "none" renders no tools; "required" prefills ``<tool_call>`` so the model must
    call one; ``forced_tool`` also prefills the name so it must call that one.
    """
    caps = TemplateCapabilities.of(tokenizer)
    tools = list(tools) if tool_mode != "none" else []
    msgs = [dict(m) for m in messages]
    kwargs: dict[str, Any] = {}
    if caps.tools:
        msgs = [_native(m, caps) for m in msgs]
        if tools:
            kwargs["tools"] = tools
    else:
        msgs = _hermes(msgs, tools, caps)
    kwargs.update(effort_kwargs(caps, reasoning_effort))
    text = _apply(tokenizer, msgs, kwargs, reasoning_effort)
    start = think_start(text, caps)
    if reasoning_effort is not None and "enable_thinking" in kwargs:
        reason = contradiction(reasoning_effort, start)
        flipped = {**kwargs, "enable_thinking": not kwargs["enable_thinking"]}
        if reason and _apply(tokenizer, msgs, flipped, reasoning_effort) == text:
            raise overridden(reasoning_effort, reason)  # the switch changed nothing
    prefill = text[text.rfind(THINK_OPEN) :] if start == "open" else ""
    forced = ""
    if forced_tool is not None:
        forced = f'{TOOL_OPEN}\n{{"name": {json.dumps(forced_tool)}, "arguments": '
    elif tool_mode == "required" and tools:
        forced = f"{TOOL_OPEN}\n"
    if forced:
        if start == "open":  # a forced call cannot wait for thinking: close the block first
            text += f"\n{THINK_CLOSE}\n\n"
        text += forced
        prefill = forced
        start = "closed"  # the output continues the call, never reasoning
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Prompt(text=text, ids=list(ids), prefill=prefill, start=start)


def _apply(
    tokenizer: Tokenizer, msgs: list[dict[str, Any]], kwargs: dict[str, Any], effort: str | None
) -> str:
    """The template's text; a template that refuses the effort's variables is a 400."""
    try:
        text = tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False, **kwargs
        )
    except TemplateError as err:
        if effort is None or not {"enable_thinking", "reasoning_effort"} & kwargs.keys():
            raise
        raise unsupported(
            "reasoning.effort", f"this model's chat template refused it: {err}"
        ) from err
    return str(text)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _native(message: dict[str, Any], caps: TemplateCapabilities) -> dict[str, Any]:
    if not caps.reasoning_content:
        message.pop("reasoning_content", None)
    calls = message.get("tool_calls")
    if calls and not caps.tool_calls:  # the template would drop them: write them as text
        blocks = _call_blocks(message.pop("tool_calls"))
        content = message.get("content")
        message["content"] = "\n".join([content, *blocks] if content else blocks)
    elif calls:
        message["tool_calls"] = [
            {
                "type": "function",
                "id": c.get("id"),
                "function": {"name": c["name"], "arguments": _arguments(c["arguments"])},
            }
            for c in calls
        ]
    return message


def _call_blocks(calls: Sequence[dict[str, Any]]) -> list[str]:
    """Past calls as the Hermes blocks the model writes (and the parser reads)."""
    return [
        f"{TOOL_OPEN}\n"
        + json.dumps(
            {"name": c["name"], "arguments": _arguments(c["arguments"])}, ensure_ascii=False
        )
        + f"\n{TOOL_CLOSE}"
        for c in calls
    ]


def _hermes(
    messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], caps: TemplateCapabilities
) -> list[dict[str, Any]]:
    """Rewrite tool traffic as plain text turns for a template that does not know tools."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if not caps.reasoning_content:
            m.pop("reasoning_content", None)
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = _call_blocks(m.pop("tool_calls"))
            m["content"] = "\n".join([m["content"], *blocks] if m.get("content") else blocks)
            out.append(m)
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            last = out[-1] if out else None
            if last is not None and last.get("_tool_results"):
                last["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(m)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        prompt = HERMES_TOOL_PROMPT.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        )
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
