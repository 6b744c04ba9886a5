"""Incremental detokenization: token ids in, text deltas out, never half a UTF-8 character.

Byte-level BPE tokens can carry part of a multi-byte character, and some tokenizers change how a
token renders depending on its left neighbour (leading spaces). So each delta is the difference
between decoding a short window of recent tokens with and without the new ones, and text whose
decoding ends in U+FFFD (an incomplete character) is held back until the next token completes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed generated token ids, get the text they add. ``flush()`` returns any held-back rest."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # tokens before this are already emitted as text
        self.text = ""  # everything emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def feed(self, token_ids: Iterable[int]) -> str:
        """Add tokens; return the newly completed text (possibly empty)."""
        self._ids.extend(int(t) for t in token_ids)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""  # nothing visible yet, or a character still incomplete
        delta = full[len(prefix) :]
        self._prefix_offset = self._read_offset  # the last emitted chunk is the next context
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The rest, even an incomplete character (as U+FFFD), at the end of a stream."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
