"""The streaming parser: generated text in, typed deltas out (text, reasoning, tool calls).

It understands the conventions of chat-template models:

* ``<think>...</think>`` is reasoning (Qwen3, DeepSeek-R1 distills, SmolLM3), at the start of
  the output or anywhere in it. A prompt that already opens ``<think>`` is passed as
  ``prefill`` so the parser starts inside it; so is a bare ``<think>`` for models that start
  inside their reasoning with no tag at all (older R1 distill templates). A ``<think>`` the
  model writes again before its first word of reasoning is the same block, not text.
* Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` is a function call (only
  when ``tools`` is on). Argument deltas stream once the name is known and the arguments
  object has begun; ``name`` after ``arguments`` or string-encoded arguments are buffered and
  emitted whole at the end of the block.
* A block that is not a valid call never raises: if nothing of it went out as a call yet, its
  raw text goes out as ordinary text (the user sees what the model wrote), unless the prompt
  opened the block (a forced ``tool_choice``: the prompt's text is not the model's answer, so a
  call cut before its arguments leaves nothing); if its arguments were already streaming, the
  call ends with ``valid=False`` (the caller marks it incomplete).

Leading and trailing whitespace of each text or reasoning segment is dropped (so "</think>\\n\\n"
does not start the answer with blank lines); it is held back, never emitted and later retracted.

Every event carries ``end``: the position in the generated text up to which it accounts for.
Consumers use it to attribute tokens (and their logprobs) to the segment where they begin.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')

Kind = Literal["text", "reasoning", "tool_call"]


@dataclass(frozen=True)
class Start:
    kind: Kind
    end: int
    name: str = ""  # tool calls: the function name


@dataclass(frozen=True)
class Delta:
    kind: Kind
    text: str
    end: int


@dataclass(frozen=True)
class End:
    kind: Kind
    end: int
    arguments: str = ""  # tool calls: the complete arguments
    valid: bool = True  # tool calls: False when the block was not a valid call


Event = Start | Delta | End


class StreamParser:
    """Feed text deltas with ``feed``; call ``finish`` once at the end. Both return events."""

    def __init__(self, *, tools: bool = False, prefill: str = "") -> None:
        self._tools = tools
        self._state: Literal["text", "reasoning", "tool", "args", "tail"] = "text"
        self._pending = ""
        self._pos = -len(prefill)  # position of _pending[0]; the prefill lies before 0
        self._open = False  # a text or reasoning segment has started
        self._events: list[Event] = []
        # tool block bookkeeping
        self._raw = ""  # the block's raw text so far, for the text fallback and validation
        self._name = ""
        self._args = ""
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._held_ws = ""  # whitespace dropped before <tool_call>, restored on fallback
        self._block_start = 0  # where that whitespace (then the block) begins
        self._text_open_before_tool = False
        self._begun = False  # the open segment has non-whitespace content
        self._cuts: list[int] = [self._pos]  # where feed chunks (whole tokens) begin
        if prefill:
            self._pending = prefill
            self._process(final=False)  # events stay queued for the first feed

    # -- public ---------------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        self._cuts = [c for c in self._cuts if c >= self._pos]
        self._cuts.append(self._pos + len(self._pending))
        self._pending += text
        self._process(final=False)
        return self._take()

    def finish(self) -> list[Event]:
        self._cuts.append(self._pos + len(self._pending))
        self._process(final=True)
        if self._state in ("text", "reasoning"):
            self._content(len(self._pending), closing=True)
        elif self._state == "args":
            self._end_call(valid=False)
        else:  # "tool" or "tail": no closing tag came; accept a complete call anyway
            self._close_block(self._raw + self._pending, consumed=len(self._pending))
            if self._state == "text":
                self._content(len(self._pending), closing=True)
        return self._take()

    # -- machinery ------------------------------------------------------------------------

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _advance(self, n: int) -> str:
        chunk, self._pending = self._pending[:n], self._pending[n:]
        self._pos += n
        return chunk

    def _tags(self) -> tuple[str, ...]:
        if self._state == "reasoning":
            return (THINK_CLOSE,) if self._begun else (THINK_CLOSE, THINK_OPEN)
        return (THINK_OPEN, TOOL_OPEN) if self._tools else (THINK_OPEN,)

    def _process(self, *, final: bool) -> None:
        while self._pending:
            before = (self._state, len(self._pending))
            if self._state in ("text", "reasoning"):
                self._step_content(final)
            elif self._state == "tool":
                self._step_tool()
            elif self._state == "args":
                self._step_args()
            else:
                self._step_tail()
            if (self._state, len(self._pending)) == before:
                return  # waiting for more text

    def _step_content(self, final: bool) -> None:
        hits = [(self._pending.find(t), t) for t in self._tags()]
        hits = [(i, t) for i, t in hits if i >= 0]
        if self._state == "reasoning":  # <think> again, before any reasoning: the same block
            hits = [(i, t) for i, t in hits if t == THINK_CLOSE or not self._pending[:i].strip()]
        if hits:
            i, tag = min(hits)
            if tag == THINK_OPEN and self._state == "reasoning":
                self._advance(i + len(tag))
                return
            size = len(self._pending)
            if tag == TOOL_OPEN:
                self._content(i, closing=False)
                # whitespace left before the tag
                self._block_start = self._pos
                self._held_ws = self._advance(i - (size - len(self._pending)))
                self._text_open_before_tool = self._open
                self._raw = self._advance(len(tag))
                self._state = "tool"
                return
            self._content(i, closing=tag == THINK_OPEN)
            self._advance(i - (size - len(self._pending)))  # whitespace left before the tag
            self._advance(len(tag))
            if tag == THINK_OPEN:
                self._state = "reasoning"
                self._events.append(Start("reasoning", self._pos))
                self._open, self._begun = True, False
            else:
                self._events.append(End("reasoning", self._pos))
                self._open = self._begun = False
                self._state = "text"
            return
        if final:
            return
        hold = max((_partial_suffix(self._pending, t) for t in self._tags()), default=0)
        self._content(len(self._pending) - hold, closing=False)

    def _content(self, n: int, *, closing: bool) -> None:
        """Emit ``_pending[:n]`` in the current segment, trimming its outer whitespace.

        Trimming stops at chunk boundaries (each ``feed`` is one or more whole tokens), so a
        token is either wholly in the emitted text or wholly out of it: the tokens attributed
        to a text part join to exactly its text.
        """
        kind: Kind = "reasoning" if self._state == "reasoning" else "text"
        chunk = self._pending[:n]
        if not self._begun:
            lead = len(chunk) - len(chunk.lstrip())
            skip = self._last_cut(self._pos, self._pos + lead) - self._pos
            self._advance(skip)
            chunk = chunk[skip:]
        body = chunk.rstrip()
        if closing and body:
            # keep trailing whitespace up to the next token boundary
            end = self._pos + len(chunk)
            body = chunk[: self._first_cut(self._pos + len(body), end) - self._pos]
        if body.strip():
            if not self._open:
                self._events.append(Start(kind, self._pos))
                self._open = True
            self._begun = True
            self._advance(len(body))
            self._events.append(Delta(kind, body, self._pos))
        if closing:
            self._advance(len(chunk) - (len(body) if body.strip() else 0))
            if self._open:
                self._events.append(End(kind, self._pos))
                self._open = self._begun = False

    def _last_cut(self, low: int, high: int) -> int:
        """The last chunk boundary in [low, high] (``low`` when there is none)."""
        return max((c for c in self._cuts if low <= c <= high), default=low)

    def _first_cut(self, low: int, high: int) -> int:
        """The first chunk boundary in [low, high] (``high`` when there is none)."""
        return min((c for c in self._cuts if low <= c <= high), default=high)

    def _step_tool(self) -> None:
        match = _HEAD.match(self._pending)
        if match:
            self._name = _unescape(match.group(1))
            self._raw += self._advance(match.end())
            self._start_call()
            self._state = "args"
            self._depth, self._in_string, self._escape = 0, False, False
            return
        close = self._pending.find(TOOL_CLOSE)
        if close >= 0:
            body = self._pending[:close]
            self._close_block(self._raw + body + TOOL_CLOSE, consumed=close + len(TOOL_CLOSE))

    def _start_call(self) -> None:
        if self._text_open_before_tool:
            self._events.append(End("text", self._pos))
            self._open = self._begun = self._text_open_before_tool = False
        self._events.append(Start("tool_call", self._pos, name=self._name))
        self._args = ""

    def _step_args(self) -> None:
        n = 0
        done = False
        text = self._pending
        while n < len(text):
            ch = text[n]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == "<":
                rest = text[n:]
                if rest.startswith(TOOL_CLOSE) or TOOL_CLOSE.startswith(rest):
                    break  # the block ends (or may end) inside the arguments: stop here
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    n += 1
                    done = True
                    break
            n += 1
        if n:
            chunk = self._advance(n)
            self._raw += chunk
            self._args += chunk
            self._events.append(Delta("tool_call", chunk, self._pos))
        if done:
            self._state = "tail"
        elif self._pending.startswith(TOOL_CLOSE):
            self._advance(len(TOOL_CLOSE))
            self._end_call(valid=False)

    def _step_tail(self) -> None:
        close = self._pending.find(TOOL_CLOSE)
        if close < 0:
            return
        body = (self._raw + self._pending[:close])[len(TOOL_OPEN) :]
        self._advance(close + len(TOOL_CLOSE))
        self._end_call(valid=_parse_call(body) == (self._name, self._args_value()))

    def _args_value(self) -> object:
        try:
            return json.loads(self._args)
        except ValueError:
            return _INVALID

    def _end_call(self, *, valid: bool) -> None:
        self._events.append(End("tool_call", self._pos, arguments=self._args, valid=valid))
        self._reset_block()

    def _reset_block(self) -> None:
        self._state = "text"
        self._raw = self._name = self._args = self._held_ws = ""
        self._open = self._begun = self._text_open_before_tool = False

    def _close_block(self, raw_block: str, *, consumed: int) -> None:
        """A block buffered whole (no streaming started): a call if it parses, else text."""
        body = raw_block[len(TOOL_OPEN) :]
        if body.endswith(TOOL_CLOSE):
            body = body[: -len(TOOL_CLOSE)]
        parsed = _parse_call(body)
        if self._state == "tail":  # streaming had started: finish the call
            self._advance(consumed)
            self._end_call(valid=parsed == (self._name, self._args_value()))
            return
        if parsed is not None:
            name, arguments = parsed
            self._name = name
            self._advance(consumed)
            self._start_call()
            args = (
                arguments
                if isinstance(arguments, str)
                else json.dumps(arguments, ensure_ascii=False)
            )
            self._events.append(Delta("tool_call", args, self._pos))
            self._events.append(End("tool_call", self._pos, arguments=args, valid=True))
            self._reset_block()
            return
        if self._block_start < 0:  # the prompt opened the call (tool_choice): a call or nothing
            self._advance(consumed)  # (a forced call the budget cut before its arguments)
            self._reset_block()
            return
        # not a call: the raw block becomes text of the (same) message
        text = self._held_ws + raw_block
        was_open = self._text_open_before_tool
        self._advance(consumed)
        self._reset_block()
        if not was_open:
            self._events.append(Start("text", self._block_start))
        self._open = self._begun = True
        self._events.append(Delta("text", text, self._pos))


_INVALID = object()


def _parse_call(body: str) -> tuple[str, object] | None:
    """(name, arguments) of a Hermes call body, or None when it is not one."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            if not isinstance(json.loads(arguments), dict):
                return None
        except ValueError:
            return None
    elif not isinstance(arguments, dict):
        return None
    return value["name"], arguments


def _unescape(s: str) -> str:
    try:
        return json.loads(f'"{s}"')
    except ValueError:
        return s


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
