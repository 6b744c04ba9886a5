"""The token grammar of a gpt-oss turn: harmony messages with a constrained answer and calls.

What the model writes after ``<|start|>assistant`` is a run of harmony messages; the grammar
names harmony's special tokens (``<|channel|>``, ``<|message|>``, ``<|constrain|>``, ``<|end|>``,
``<|call|>``, ``<|return|>``, ``<|start|>``) as tokens, never as text, and constrains only what
the request asks for:

- reasoning (``analysis`` messages) is free text, as many messages as the model likes;
- ``text.format`` json_object / json_schema: the ``final`` message is one JSON value of the
  schema, its header with or without harmony's ``<|constrain|>json`` content type;
- function tools, ``tool_choice`` "auto": free messages (reasoning, ``commentary`` preambles, a
  free ``final``) until the model addresses a function; the recipient must then be
  ``functions.NAME`` of a given tool on ``commentary`` with ``<|constrain|>json``, and the
  content that tool's arguments, ended by ``<|call|>``;
- "required": reasoning, then one call to one of the tools; a named ``tool_choice``: that
  tool's call. ``<|call|>`` is a stop token, so the turn ends after the call;
- built-in tools the request enables (``python``, ``browser.*``): their calls stay free (the
  tool reads its own input) and end the round as before; in "required" mode the model must
  call a function tool.

The recipient may come before the channel (``to=functions.f<|channel|>commentary``, as harmony
renders calls) or after it (``<|channel|>commentary to=functions.f``). JSON is compact
(``,`` and ``:``, no whitespace), the layout of harmony's own schemas and call examples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from openai_harmony import HarmonyEncoding

from nbresponses.families.constrain import ToolSchema
from nbresponses.families.harmony.token_bytes import vocabulary_bytes
from nbresponses.grammar.matcher import COMPACT_JSON, GrammarTokenizer, json_lark, lark_string


class ToolChoice(Protocol):
    tool_mode: str  # none / auto / required
    forced_tool: str | None


_NEXT = '<|end|> <|start|> "assistant"'  # a message ended and the next one begins
_CACHE: dict[str, GrammarTokenizer] = {}


def grammar_tokenizer(encoding: HarmonyEncoding) -> GrammarTokenizer:
    """The o200k harmony vocabulary as the grammar engine sees it (once per process: ~0.5 s)."""
    key = encoding.name
    if key not in _CACHE:

        def special(name: str) -> int:
            return int(encoding.encode(name, allowed_special={name})[0])

        return_id = special("<|return|>")
        # the special tokens a closing walk may take to end a turn, in order of preference;
        # <|channel|> opens another message: taken only when no byte may come (a walk that
        # preferred it at the turn's start would go round reasoning messages and find no end)
        closers = [special(name) for name in ("<|call|>", "<|end|>", "<|start|>", "<|message|>")]
        openers = [special("<|channel|>")]
        tokens = vocabulary_bytes(encoding)
        _CACHE[key] = GrammarTokenizer.from_bytes(
            tokens,
            encode=lambda text: encoding.encode(text, disallowed_special=()),
            eos_token_id=return_id,
            special_token_ids=[i for i in range(len(tokens)) if encoding.is_special_token(i)],
            closers=closers,
            openers=openers,
        )
    return _CACHE[key]


def response_format_section(fmt: dict[str, Any] | None) -> str | None:
    """The developer message's ``# Response Formats`` section for a json_schema format (the
    harmony guide's layout); json_object has no schema to show."""
    if fmt is None or fmt["type"] != "json_schema":
        return None
    lines = ["# Response Formats", "", f"## {fmt['name']}", ""]
    if fmt.get("description"):
        lines.append(f"// {fmt['description']}")
    lines.append(json.dumps(fmt["schema"], separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines)


def harmony_grammar(
    answer: dict[str, Any] | None,
    tools: Sequence[ToolSchema],
    choice: ToolChoice,
    *,
    builtin: Sequence[str] = (),
) -> str | None:
    """The Lark grammar of one round of generation (None: unconstrained). ``choice`` is the
    request's tool choice (``tool_mode``, ``forced_tool``); ``builtin`` names the built-in
    tool namespaces the system message describes (``python``, ``browser``)."""
    mode, forced_tool = choice.tool_mode, choice.forced_tool
    calls = bool(tools) and mode != "none"
    if not calls and answer is None:
        return None
    rules = [
        f'reasoning: <|channel|> "analysis" <|message|> TEXT {_NEXT}',
        "TEXT: /(?s:.*)/",  # special tokens are tokens, never text: a message cannot leak
    ]
    if calls:
        for i, tool in enumerate(tools):
            to = lark_string(f" to=functions.{tool.name}")
            route = f'({to} <|channel|> "commentary" | <|channel|> "commentary" {to})'
            rules.append(f'call{i}: {route} " "? <|constrain|> "json" <|message|> args{i} <|call|>')
            rules.append(f"args{i}: {json_lark(tool.arguments, COMPACT_JSON)}")
    if calls and mode == "required":
        if forced_tool is not None:
            i = next(i for i, t in enumerate(tools) if t.name == forced_tool)
            return _lark(f"reasoning* call{i}", rules)
        return _lark(
            "reasoning* (" + " | ".join(f"call{i}" for i in range(len(tools))) + ")", rules
        )
    if answer is not None:
        header = '<|channel|> "final" (" "? <|constrain|> "json")? <|message|>'
        rules.append(f"final: {header} answer <|return|>")
        rules.append(f"answer: {json_lark(answer, COMPACT_JSON)}")
    else:
        rules.append('final: <|channel|> "final" <|message|> TEXT <|return|>')
    before = "reasoning"
    last = ["final"]
    if calls:
        rules.append(f'preamble: <|channel|> "commentary" <|message|> TEXT {_NEXT}')
        before = "(reasoning | preamble)"
        last += [f"call{i}" for i in range(len(tools))]
    if builtin:
        names = " | ".join(
            lark_string(ns) if ns == "python" else f"{lark_string(ns + '.')} /[A-Za-z_]+/"
            for ns in builtin
        )
        rules += [
            f"recipient: {names}",
            'channel: "analysis" | "commentary"',
            'route: " to=" recipient <|channel|> channel | <|channel|> channel " to=" recipient',
            'ctype: " " CTYPE | " "? <|constrain|> CTYPE',
            "CTYPE: /[A-Za-z0-9_.\\-]+/",
            "builtin: route ctype? <|message|> TEXT <|call|>",
        ]
        last.append("builtin")
    return _lark(f"{before}* ({' | '.join(last)})", rules)


def _lark(start: str, rules: list[str]) -> str:
    return "\n".join([f"start: {start}", *rules]) + "\n"
