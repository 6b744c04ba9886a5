"""Streaming parse of gpt-oss output: harmony token ids in, typed segment events out.

harmony's own ``StreamableParser`` tracks the grammar (headers, channels, recipients, message
ends); this wrapper turns each assistant message into a *segment* of one kind:

==========================  ====================================================
message                     segment kind
==========================  ====================================================
to ``functions.NAME``       ``function_call`` (``name`` = NAME; text = arguments)
to a built-in tool          the tool's item type (``tools/registry.py``): to ``python``
                            ``code_interpreter_call`` (text = code), to
                            ``browser.search|open|find`` ``web_search_call`` (``name`` =
                            the function; text = JSON args, which the tool reads)
to any other recipient      ``function_call`` with ``name`` = the recipient, ended invalid
channel ``analysis``        ``reasoning``
channel ``final``           ``text``
channel ``commentary``      ``text`` (a preamble; ``channel`` says so)
==========================  ====================================================

Token accounting is exact: every token fed belongs to exactly one event. A segment's header
(``<|start|>assistant<|channel|>...<|message|>``) is on its ``SegmentStart``, its content on the
``SegmentDelta``s, its terminator (``<|end|>``, ``<|call|>``, ``<|return|>``) on its
``SegmentEnd``; tokens outside any assistant message (a header cut off by the token limit, text the
grammar rejects, a message the model wrote as another role) come out as ``Stray`` events. So the
reasoning token count is ``sum(e.total_tokens)`` over the ``SegmentEnd``s of kind ``reasoning``.

Logprobs passed to ``feed`` travel with their tokens. A token that ends inside a UTF-8 character
has no text yet: it waits and goes out with the next delta, so deltas never carry empty text
(``len(token_ids)`` of a delta may be more than one).

Documented behaviours:

* **Cut off** (the generation stopped without a terminator, e.g. ``max_output_tokens``):
  ``finish()`` ends the open segment with ``cut_off=True`` and no terminator token. A function
  call cut off is also ``valid=False`` unless its arguments happen to be complete JSON.
* **Malformed function-call JSON never raises**: the call still ends as a ``function_call`` with
  the raw text as ``arguments``, ``valid=False`` and ``error`` saying why. The model meant to call
  a tool, so the protocol layer emits the call item marked incomplete rather than showing its
  argument text as an answer; the user still sees exactly what the model wrote.
* A built-in tool call is always ``valid``: what its text means is the tool's to say.
* ``<|channel|>final <|constrain|>json<|message|>`` (a structured answer's header) is a final
  message with content type ``<|constrain|>json``; harmony's parser takes the content type for a
  recipient when there is none, which is undone here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from openai_harmony import (
    HarmonyEncoding,
    HarmonyError,
    Message,
    Role,
    StreamableParser,
    StreamState,
)

from nbresponses.tokens.contract import TokenIdLogprob
from nbresponses.tools import registry

CONSTRAIN = "<|constrain|>"
# "reasoning", "text", "function_call", or a built-in tool's item type
SegmentKind = str


@dataclass(frozen=True)
class SegmentStart:
    """A message's header is complete: its kind and routing are known."""

    index: int  # segment number in this generation, from 0
    kind: SegmentKind
    channel: str | None
    recipient: str | None
    content_type: str | None
    name: str  # function_call: the function; a built-in tool call: its function; else ""
    token_ids: tuple[int, ...]  # the header tokens
    logprobs: tuple[TokenIdLogprob, ...] | None = None


@dataclass(frozen=True)
class SegmentDelta:
    """New content: text, reasoning, argument JSON or code (never empty)."""

    index: int
    kind: SegmentKind
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenIdLogprob, ...] | None = None


@dataclass(frozen=True)
class SegmentEnd:
    """The message ended (or was cut off). ``text`` is its whole content."""

    index: int
    kind: SegmentKind
    channel: str | None
    recipient: str | None
    name: str
    text: str
    token_ids: tuple[int, ...]  # the terminator, or () when cut off
    total_tokens: int  # header + content + terminator tokens of this segment
    logprobs: tuple[TokenIdLogprob, ...] | None = None
    cut_off: bool = False
    valid: bool = True
    error: str | None = None
    terminator: str | None = None  # "<|end|>", "<|call|>", "<|return|>"; None when cut off

    @property
    def arguments(self) -> str:
        """function_call: the raw arguments JSON (alias of ``text``)."""
        return self.text

    @property
    def code(self) -> str:
        """code_interpreter_call: the code (alias of ``text``)."""
        return self.text


@dataclass(frozen=True)
class Stray:
    """Tokens outside any assistant segment; counted in usage, shown nowhere."""

    token_ids: tuple[int, ...]
    text: str
    reason: str
    logprobs: tuple[TokenIdLogprob, ...] | None = None


Event = SegmentStart | SegmentDelta | SegmentEnd | Stray


def classify(channel: str | None, recipient: str | None) -> tuple[SegmentKind, str, str | None]:
    """(kind, name, error) of a message from its channel and recipient."""
    if recipient:
        if recipient.startswith("functions."):
            return "function_call", recipient.removeprefix("functions."), None
        builtin = registry.for_recipient(recipient)
        if builtin is not None:
            tool, function = builtin
            return tool.item_type, function, None
        return "function_call", recipient, f"unknown recipient {recipient!r}"
    if channel == "analysis":
        return "reasoning", "", None
    return "text", "", None


def _validate(kind: SegmentKind, text: str) -> tuple[bool, str | None]:
    """(valid, error) of a finished segment's content: function-call arguments must be a JSON
    object; a built-in tool reads its own arguments."""
    if kind != "function_call":
        return True, None
    try:
        value = json.loads(text)
    except ValueError as exc:
        return False, f"arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return False, "arguments are not a JSON object"
    return True, None


@dataclass
class _Open:
    """Book-keeping of the segment being generated."""

    index: int
    kind: SegmentKind
    channel: str | None
    recipient: str | None
    content_type: str | None
    name: str
    error: str | None
    tokens: int
    text: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # tokens whose text is not complete yet
    held_lp: list[TokenIdLogprob | None] = field(default_factory=list)


def _lps(values: Sequence[TokenIdLogprob | None]) -> tuple[TokenIdLogprob, ...] | None:
    if not values or any(v is None for v in values):
        return None
    return tuple(v for v in values if v is not None)


class HarmonyStreamParser:
    """Feed generated ids with ``feed`` (one at a time), then call ``finish`` once.

    Expects the prompt to end with ``<|start|>assistant`` (as ``render_request`` makes it), so
    the first tokens are the first message's header.
    """

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._enc = encoding
        self._parser = StreamableParser(encoding, Role.ASSISTANT)
        self._pending: list[int] = []  # tokens since the last segment ended (a header)
        self._pending_lp: list[TokenIdLogprob | None] = []
        self._open: _Open | None = None
        self._foreign: str | None = None  # role of a non-assistant message being read
        self._count = 0
        self._finished = False
        self.messages: list[Message] = []  # completed assistant messages, for the tool loop
        self.reasoning_tokens = 0

    @property
    def segment(self) -> _Open | None:
        return self._open

    def feed(self, token_id: int, logprob: TokenIdLogprob | None = None) -> list[Event]:
        """Process one generated token; returns the events it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        events: list[Event] = []
        was_content = self._open is not None or self._foreign is not None
        try:
            self._parser.process(token_id)
        except HarmonyError as exc:
            self._stray_now(token_id, logprob, f"not valid harmony here: {exc}", events)
            return events
        state = self._parser.state
        if was_content:
            if state == StreamState.CONTENT:
                self._content(token_id, logprob, events)
            else:  # the terminator
                self._end(token_id, logprob, events)
            return events
        self._pending.append(token_id)
        self._pending_lp.append(logprob)
        if state == StreamState.CONTENT:
            self._start(events)
        return events

    def finish(self) -> list[Event]:
        """End of generation: close what is open (cut off) and report leftover tokens."""
        if self._finished:
            return []
        self._finished = True
        events: list[Event] = []
        if self._open is not None:
            self._flush_held(events)
            self._close(events, (), None, terminator=None, cut_off=True)
        elif self._foreign is not None or self._pending:
            reason = (
                f"a message from {self._foreign} was cut off"
                if self._foreign
                else "cut off inside a message header"
            )
            self._stray_pending(reason, events)
        return events

    # -- machinery ---------------------------------------------------------------------------

    def _start(self, events: list[Event]) -> None:
        role = self._parser.current_role
        if role is not None and role != Role.ASSISTANT:
            self._foreign = role.value  # a message the model wrote as another role: not output
            return
        channel = self._parser.current_channel
        recipient = self._parser.current_recipient
        content_type = self._parser.current_content_type
        if recipient is not None and recipient.startswith(CONSTRAIN):
            # "<|channel|>final <|constrain|>json": harmony reads the content type as the
            # recipient when there is none (a structured answer's header)
            recipient, content_type = None, recipient
        kind, name, error = classify(channel, recipient)
        header, header_lp = tuple(self._pending), _lps(self._pending_lp)
        self._open = _Open(
            index=self._count,
            kind=kind,
            channel=channel,
            recipient=recipient,
            content_type=content_type,
            name=name,
            error=error,
            tokens=len(header),
        )
        self._count += 1
        self._pending, self._pending_lp = [], []
        events.append(
            SegmentStart(
                self._open.index,
                kind,
                channel,
                recipient,
                self._open.content_type,
                name,
                header,
                header_lp,
            )
        )

    def _content(self, token_id: int, logprob: TokenIdLogprob | None, events: list[Event]) -> None:
        if self._open is None:  # inside a foreign message
            self._pending.append(token_id)
            self._pending_lp.append(logprob)
            return
        seg = self._open
        seg.tokens += 1
        seg.held.append(token_id)
        seg.held_lp.append(logprob)
        delta = self._parser.last_content_delta
        if delta:
            seg.text.append(delta)
            events.append(
                SegmentDelta(seg.index, seg.kind, delta, tuple(seg.held), _lps(seg.held_lp))
            )
            seg.held, seg.held_lp = [], []

    def _flush_held(self, events: list[Event]) -> None:
        """Tokens still waiting for a complete character when the segment ends."""
        seg = self._open
        if seg is None or not seg.held:
            return
        text = self._enc.decode(seg.held)  # incomplete UTF-8 becomes U+FFFD
        seg.text.append(text)
        events.append(SegmentDelta(seg.index, seg.kind, text, tuple(seg.held), _lps(seg.held_lp)))
        seg.held, seg.held_lp = [], []

    def _end(self, token_id: int, logprob: TokenIdLogprob | None, events: list[Event]) -> None:
        if self._open is None:  # a foreign message ended
            self._pending.append(token_id)
            self._pending_lp.append(logprob)
            self._stray_pending(f"a message from {self._foreign} is not assistant output", events)
            self._foreign = None
            return
        self._flush_held(events)
        terminator = self._enc.decode([token_id])
        self._close(events, (token_id,), logprob, terminator=terminator, cut_off=False)

    def _close(
        self,
        events: list[Event],
        token_ids: tuple[int, ...],
        logprob: TokenIdLogprob | None,
        *,
        terminator: str | None,
        cut_off: bool,
    ) -> None:
        seg = self._open
        assert seg is not None
        self._open = None
        seg.tokens += len(token_ids)
        text = "".join(seg.text)
        valid, error = _validate(seg.kind, text)
        if seg.error is not None:
            valid, error = False, seg.error
        if seg.kind == "reasoning":
            self.reasoning_tokens += seg.tokens
        events.append(
            SegmentEnd(
                index=seg.index,
                kind=seg.kind,
                channel=seg.channel,
                recipient=seg.recipient,
                name=seg.name,
                text=text,
                token_ids=token_ids,
                total_tokens=seg.tokens,
                logprobs=_lps([logprob]) if token_ids else None,
                cut_off=cut_off,
                valid=valid,
                error=error,
                terminator=terminator,
            )
        )
        if not cut_off:
            self.messages.append(self._message(seg, text))

    @staticmethod
    def _message(seg: _Open, text: str) -> Message:
        msg = Message.from_role_and_content(Role.ASSISTANT, text)
        if seg.channel is not None:
            msg = msg.with_channel(seg.channel)
        if seg.recipient is not None:
            msg = msg.with_recipient(seg.recipient)
        if seg.content_type is not None:
            msg = msg.with_content_type(seg.content_type)
        return msg

    def _stray_now(
        self, token_id: int, logprob: TokenIdLogprob | None, reason: str, events: list[Event]
    ) -> None:
        """A token harmony rejected: it and any partial header are stray; start over."""
        if self._open is not None:  # cannot happen inside content; close defensively
            self._flush_held(events)
            self._close(events, (), None, terminator=None, cut_off=True)
        self._pending.append(token_id)
        self._pending_lp.append(logprob)
        self._stray_pending(reason, events)
        self._foreign = None
        # After an error the inner parser's state is unknown: expect a fresh <|start|>.
        self._parser = StreamableParser(self._enc, None)

    def _stray_pending(self, reason: str, events: list[Event]) -> None:
        if not self._pending:
            return
        ids = tuple(self._pending)
        events.append(Stray(ids, self._enc.decode(list(ids)), reason, _lps(self._pending_lp)))
        self._pending, self._pending_lp = [], []
