"""The shortest way to finish a grammar from where a generation stands: what budget-aware
closing forces when the tokens left would otherwise cut a structured answer off.

llguidance can say which tokens may come next but not how far the end is, so this walks a copy
of the matcher: bytes the grammar forces are taken as they are (``compute_ff_bytes``: key names,
the rest of a ``const``); otherwise the first allowed candidate in a fixed order of preference:
the end token, the family's closing special tokens, then single bytes that close what is open
(``"``, ``]``, ``}``), the shortest values (``0``, ``""``, ``[]``, ``{}``, ``null``, ``false``),
separators, then letters and digits (so an enum, a pattern or a required key still completes).
Right after an opener (``[`` or ``{``) its closer is tried first: an empty container, not an
empty first item. Special tokens that open a new part (harmony's ``<|channel|>``) come last. The
walk is greedy, so it is short rather than provably shortest; it gives up (None) after ``limit``
steps, which happens only where the grammar lets the walk wander (an object that allows extra
keys and still misses a required one). The bytes found are then tokenized as the tokenizer would
write them (each run of text between special tokens; fewer tokens than one per byte), checked
against another copy, and the end token appended."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import llguidance

_CLOSERS = b'"]}'
_AFTER = (  # "," before the digits: after "7" the walk moves on instead of writing "7000..."
    b",0: {[\n<>/"
    + b"nultrefas"
    + b"bcdghijkmopqvwxyz_123456789-.+"
    + b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    + b"!#$%&'()*=?@\\^`|~;"
)
PREFERENCE = _CLOSERS + _AFTER


class ClosingVocab:
    """The single-byte tokens and special closers a walk may use, in order of preference."""

    def __init__(
        self,
        tokens: Sequence[bytes],
        ll: llguidance.LLTokenizer,
        closers: Sequence[int],
        openers: Sequence[int] = (),
    ) -> None:
        single: dict[int, int] = {}
        for i, b in enumerate(tokens):
            if len(b) == 1 and b[0] not in single and not ll.is_special_token(i):
                single[b[0]] = i
        self.eos = int(ll.eos_token)
        self.closers = [int(t) for t in closers if int(t) != self.eos]
        # special tokens that open something (harmony's <|channel|>): tried after every byte,
        # so a walk that may go on in text does not start another message and loop through it
        self.openers = [int(t) for t in openers if int(t) != self.eos]
        self.bytes_first = [single[c] for c in PREFERENCE if c in single]
        self.bytes_opened = {
            opener: [single[c] for c in (bytes([closer]) + PREFERENCE) if c in single]
            for opener, closer in ((ord("["), ord("]")), (ord("{"), ord("}")))
        }
        self.ll = ll

    def order(self, last_byte: int | None) -> list[int]:
        by_bytes = self.bytes_opened.get(last_byte, self.bytes_first) if last_byte else None
        return [self.eos, *self.closers, *(by_bytes or self.bytes_first), *self.openers]


def shortest_closing(matcher: Any, vocab: ClosingVocab, limit: int) -> list[int] | None:
    """Token ids that take ``matcher`` (an ``llguidance.LLMatcher``, left untouched) to its
    end, the end token included; None when no way within ``limit`` steps was found."""
    walk = matcher.deep_copy()
    path: list[int] = []
    text = bytearray()
    for _ in range(limit):
        if walk.is_stopped():  # nothing but the end token may follow
            return _tokenized(matcher, vocab, bytes(text), [*path, vocab.eos])
        forced = _forced_tokens(walk.compute_ff_bytes(), vocab)
        if forced:
            taken = walk.try_consume_tokens(forced)
            path += forced[:taken]
            text += vocab.ll.decode_bytes(forced[:taken])
            if taken:
                continue
        for token in vocab.order(text[-1] if text else None):
            if walk.validate_tokens([token]) == 1:
                walk.consume_token(token)
                path.append(token)
                if token == vocab.eos:
                    return _tokenized(matcher, vocab, bytes(text), path)
                text += vocab.ll.decode_bytes([token])
                break
        else:
            return None
    return None


_SPECIAL = re.compile(rb"\xff\[(\d+)\]")  # how llguidance writes a special token in bytes


def _forced_tokens(forced: bytes, vocab: ClosingVocab) -> list[int]:
    """The tokens of forced bytes: text tokenized, special tokens by their ids."""
    out: list[int] = []
    at = 0
    for m in _SPECIAL.finditer(forced):
        if m.start() > at:
            out += vocab.ll.tokenize_bytes(forced[at : m.start()])
        out.append(int(m.group(1)))
        at = m.end()
    if at < len(forced):
        out += vocab.ll.tokenize_bytes(forced[at:])
    return out


def _tokenized(matcher: Any, vocab: ClosingVocab, text: bytes, walked: list[int]) -> list[int]:
    """The walk's tokens with each run of plain text between special tokens re-tokenized as
    the tokenizer would write it (fewer tokens than one per byte), when the grammar takes
    them. ``text`` is the walk's plain bytes (its special tokens are not in it)."""
    if not text:
        return walked
    ids: list[int] = []
    run = bytearray()
    for token in walked:
        if token == vocab.eos or vocab.ll.is_special_token(token):
            if run:
                ids += vocab.ll.tokenize_bytes(bytes(run))
                run.clear()
            ids.append(token)
        else:
            run += vocab.ll.decode_bytes([token])
    if run:
        ids += vocab.ll.tokenize_bytes(bytes(run))
    if len(ids) < len(walked) and matcher.validate_tokens(ids) == len(ids):
        return ids
    return walked
