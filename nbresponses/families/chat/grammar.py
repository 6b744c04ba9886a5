"""The token grammar of a chat-template model's answer: JSON formats and Hermes tool calls.

The answer is constrained only as far as the request asks:
- ``text.format`` json_object / json_schema: the answer is one JSON value of the schema;
- ``tool_choice`` "required": the reply (after the prefilled ``<tool_call>`` opener) is one call
  to one of the tools, its name one of theirs and its arguments their schema; a named
  ``tool_choice`` prefills the name as well and constrains the arguments. The turn ends after
  the forced call (only the end-of-turn token may follow);
- "auto" with tools: the model writes freely until it opens a ``<tool_call>``; from there the
  name and arguments are constrained, then more calls (``parallel_tool_calls``) or the end.
Whitespace inside JSON is fixed to the layout the prompt shows (``", "`` and ``": "``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nbresponses.families.chat.parser import THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN
from nbresponses.families.constrain import ToolSchema
from nbresponses.grammar.matcher import json_lark, lark_string

# Text that does not contain a tool-call opener (llguidance regexes have & and ~).
_NO_CALL = f"/(?s:.*)/ & ~/(?s:.*){TOOL_OPEN}(?s:.*)/"
# The reasoning through its first </think>, as one lexeme: a lexeme that stopped before the tag
# would be extended by "</think" greedily and then refuse the ">".
_THINKING = r"/(?s:.*)<\/think>/ & ~/(?s:.*)<\/think>(?s:.+)/"
_THINK_BLOCK = r"/<think>(?s:.*)<\/think>/ & ~/<think>(?s:.*)<\/think>(?s:.+)/"


def chat_grammar(
    *,
    answer: dict[str, Any] | None,
    tools: Sequence[ToolSchema],
    mode: str,
    forced_tool: str | None,
    parallel: bool,
    prefill: str,
    may_think: bool = False,
) -> str | None:
    """The Lark grammar of what the model generates after the prompt (None: unconstrained).

    ``may_think``: the model may open a ``<think>`` block of its own first (Qwen3, SmolLM3
    with thinking on); a format that holds the answer from the first token would forbid it.
    """
    calls = bool(tools) and mode != "none"
    if not calls and answer is None:
        return None
    rules: list[str] = []
    for i, tool in enumerate(tools):
        rules.append(f"args{i}: {json_lark(tool.arguments)}")
    call = " | ".join(
        f'"{{\\"name\\": " {lark_string(json.dumps(t.name))} ", \\"arguments\\": " args{i} "}}"'
        for i, t in enumerate(tools)
    )
    close = lark_string(f"\n{TOOL_CLOSE}")
    reopen = lark_string(f"\n{TOOL_OPEN}\n")
    if calls:
        rules.append(f"call: {call}")
    if calls and mode == "required":
        if forced_tool is not None:
            i = next(i for i, t in enumerate(tools) if t.name == forced_tool)
            start = f'args{i} "}}" {close}'  # the prompt ends with ..."arguments":
        else:
            start = f"call {close}"  # the prompt ends with "<tool_call>\n"
        return _lark(start, rules)
    body = "answer" if answer is not None else "TEXT?"
    if answer is not None:
        rules.append(f"answer: {json_lark(answer)}")
    if calls:
        more = f"({reopen} call {close})*" if parallel else ""
        opener = lark_string(f"{TOOL_OPEN}\n")
        if answer is None:
            rules.append(f"TEXT: /(?s:.+)/ & ~/(?s:.*){TOOL_OPEN}(?s:.*)/")
            rules.append(f"OPEN: NOCALL {opener}")
            rules.append(f"NOCALL: {_NO_CALL}")
            start = f"{body} | OPEN call {close} {more}"
        else:
            start = f"{body} | {opener} call {close} {more}"
    else:
        start = body
    if prefill.startswith(THINK_OPEN):  # the prompt opened <think>: reasoning comes first
        rules.append(f"THINKING: {_THINKING}")
        start = f"THINKING /[ \\t\\n]*/ ({start})"
    elif may_think and answer is not None:  # free text (with calls) admits a block already
        rules.append(f"THINKING: {_THINK_BLOCK}")
        start = f"(THINKING /[ \\t\\n]*/)? ({start})"
    return _lark(start, rules)


def guard_after(*, answer: bool, calls: bool, mode: str, prefill: str) -> str | None:
    """Where the repetition guard starts watching (``grammar/repetition.py``): at the tool-call
    opener when free text may come first, after the reasoning the prompt opened, else from the
    first token. Free text is the model's own; only constrained values are guarded."""
    if calls and mode == "auto" and not answer:
        return TOOL_OPEN
    if prefill.startswith(THINK_OPEN):
        return THINK_CLOSE
    return None


def _lark(start: str, rules: list[str]) -> str:
    return "\n".join([f"start: {start}", *rules]) + "\n"
