"""The repetition guard: a constrained JSON value that only repeats itself is made to end.

Under a grammar a small model at temperature 0 often falls into a loop the grammar cannot end
for it: ``"tags": ["finance", "finance", ...``, the same object copied over and over, a string
``"1234567890123456789012..."``. Free text would wander off or stop; inside JSON the loop runs
until the budget does. The guard reads the bytes written since the constrained part began with
a small JSON scanner (strings, escapes, nesting) and applies two rules, each a documented
default that a request turns off with ``repetition_guard: false``:

- **a list that repeats itself ends**: once an array holds ``DUPLICATES`` items that repeat an
  earlier item of it (strings, objects and arrays, compared by their exact text; numbers and
  literals never count), no token may add another item to it (tokens that would write a ``,``
  at its level are banned), so the model closes it;
- **a string that loops ends**: once the text inside a string ends with ``COPIES`` copies of one
  period (at most ``MAX_PERIOD`` bytes, the run at least ``MIN_BYTES``), only tokens that close
  the string are allowed.

Numbers are left alone (``[0, 0, 0, ...]`` is often meant); a list of them, like any answer that
does not loop exactly, is ended in time by budget-aware closing (``tokens/closing.py``).

A ban never empties the mask: where it would, nothing is banned (budget-aware closing still
ends the answer in time). The guard depends only on the row's own tokens, so a guarded request
gives the same bits alone and batched; reported logprobs stay the model's (before any mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DUPLICATES = 3  # ["a", "b", "a", "b", "a"]: the third repeat closes the list
COPIES = 3  # "abcabcabc...": three copies of the period close the string
MAX_PERIOD = 128  # bytes
MIN_BYTES = 24  # a run shorter than this is never a loop (the digits of a number, "...")


@dataclass
class _Array:
    seen: set[bytes] = field(default_factory=set)
    repeats: int = 0
    item_start: int | None = None  # where the item being written began (in ``text``)


@dataclass(frozen=True)
class Ban:
    """What the guard asks of the next token: ``only`` (allow just these) or ``banned``."""

    only: Sequence[int] | None = None
    banned: Sequence[int] = ()


class RepetitionGuard:
    """One generation's watch over its own bytes (after ``start``, when given)."""

    def __init__(
        self,
        tokens: Sequence[bytes],
        with_comma: Sequence[int],
        with_quote: Sequence[int],
        *,
        start: bytes | None = None,
    ) -> None:
        self._tokens = tokens
        self._with_comma = with_comma
        self._with_quote = with_quote
        self._pending_start = start  # watch only after this text (the free text before it)
        self._seen = bytearray()  # everything written, until ``start`` is found
        self.text = bytearray()  # the bytes watched
        self._in_string = False
        self._escape = False
        self._string_start = 0
        self._stack: list[_Array | None] = []  # None for an object
        # run[L]: how many of the last bytes equal the byte L before them
        self._run = np.zeros(MAX_PERIOD + 1, dtype=np.int64)
        self._periods = np.arange(MAX_PERIOD + 1)

    # -- reading ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._pending_start is not None:
            self._seen += data
            at = self._seen.find(self._pending_start)
            if at < 0:
                return
            data = bytes(self._seen[at + len(self._pending_start) :])
            self._pending_start = None
            self._seen = bytearray()
        for byte in data:
            self._period(byte)
            self._scan(byte)

    def _period(self, byte: int) -> None:
        text = self.text
        n = len(text)
        k = min(n, MAX_PERIOD)
        if k:  # text[n - L] for L = 1..k, against the new byte
            back = np.frombuffer(bytes(text[n - k :]), dtype=np.uint8)[::-1]
            run = self._run
            run[1 : k + 1] = np.where(back == byte, run[1 : k + 1] + 1, 0)
        text.append(byte)

    def _scan(self, byte: int) -> None:
        at = len(self.text) - 1  # this byte's place
        if self._in_string:
            if self._escape:
                self._escape = False
            elif byte == 0x5C:  # backslash
                self._escape = True
            elif byte == 0x22:  # the closing quote
                self._in_string = False
                self._item_done(at + 1)
            return
        top = self._stack[-1] if self._stack else None
        if isinstance(top, _Array) and top.item_start is None and byte not in b" \n\t,]":
            top.item_start = at
        if byte == 0x22:
            self._in_string = True
            self._string_start = at + 1
        elif byte in b"[{":
            self._stack.append(_Array() if byte == 0x5B else None)
        elif byte in b"]}":
            if self._stack:
                self._stack.pop()
            self._item_done(at + 1)
        elif byte == 0x2C and isinstance(top, _Array):  # the next item of an array
            top.item_start = None

    def _item_done(self, end: int) -> None:
        """A string, object or array ended: if it was an item of an array, count a repeat."""
        top = self._stack[-1] if self._stack else None
        if not isinstance(top, _Array) or top.item_start is None:
            return
        item = bytes(self.text[top.item_start : end])
        if item[:1] not in (b'"', b"{", b"["):
            return
        if item in top.seen:
            top.repeats += 1
        else:
            top.seen.add(item)

    # -- deciding ---------------------------------------------------------------------------

    def ban(self) -> Ban:
        """What the next token may not be (or must be), given what was written."""
        level = self._repeating_list()
        if level is not None:
            return Ban(banned=[t for t in self._with_comma if self._adds_item(t, level)])
        if self._in_string and self._string_loops():
            return Ban(only=[t for t in self._with_quote if self._closes_string(t)])
        return Ban()

    def _repeating_list(self) -> int | None:
        """How many levels below the innermost array we are, if that array repeats itself."""
        for up, node in enumerate(reversed(self._stack)):
            if isinstance(node, _Array):
                return up if node.repeats >= DUPLICATES else None
        return None

    def _string_loops(self) -> bool:
        """Does the open string end with ``COPIES`` copies of one period (``MIN_BYTES`` at
        least, all inside the string)?"""
        span = self._run + self._periods  # the run of period L spans run[L] + L bytes
        need = np.maximum(COPIES * self._periods, MIN_BYTES)
        room = len(self.text) - self._string_start
        hit = (span >= need) & (self._periods > 0) & (span <= room)
        return bool(hit.any())

    def _adds_item(self, token: int, depth: int) -> bool:
        """Would ``token`` write a ``,`` at the level of the innermost array (a new item)?
        ``depth``: how many containers inside that array the writing stands."""
        in_string, escape = self._in_string, self._escape
        for byte in self._tokens[token]:
            if in_string:
                if escape:
                    escape = False
                elif byte == 0x5C:
                    escape = True
                elif byte == 0x22:
                    in_string = False
            elif byte == 0x22:
                in_string = True
            elif byte in b"[{":
                depth += 1
            elif byte in b"]}":
                depth -= 1
                if depth < 0:
                    return False  # the array closes first
            elif byte == 0x2C and depth == 0:
                return True
        return False

    def _closes_string(self, token: int) -> bool:
        escape = self._escape
        for byte in self._tokens[token]:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                return True
        return False
