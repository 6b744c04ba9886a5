"""Rebuild token text from token bytes, where one token may hold part of a UTF-8 character.

Each token's ``text`` is the characters its bytes complete (what a streaming decoder emits on
that token), so joining ``text`` over a part gives the decoded part and ``char_offset`` is
where the token's text starts in it. Invalid UTF-8 decodes per token with U+FFFD.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

__all__ = ["PartText", "part_text", "token_bytes"]

_ESCAPED = re.compile(r"(?:\\x[0-9a-fA-F]{2})+")

PartText = tuple[list[bytes], list[str], np.ndarray, np.ndarray]


def token_bytes(token: str) -> bytes:
    """Bytes of a token sent without ``bytes`` (stream deltas): ``bytes:\\xe2\\x80`` or its text."""
    if token.startswith("bytes:") and _ESCAPED.fullmatch(token, 6):
        return bytes.fromhex(token[6:].replace("\\x", ""))
    return token.encode("utf-8", errors="surrogatepass")


def _lengths(items: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(len, items), dtype=np.int64, count=len(items))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.cumsum(lengths) - lengths


def _split_strict(text: str, buf: bytes, lengths: np.ndarray) -> tuple[list[str], np.ndarray]:
    data = np.frombuffer(buf, dtype=np.uint8)
    is_cont = np.append((data & 0xC0) == 0x80, False)
    starts_before = np.concatenate(([0], np.cumsum(~is_cont[:-1], dtype=np.int64)))
    ends = np.cumsum(lengths, dtype=np.int64)
    begins = ends - lengths
    # characters fully decoded once the first x bytes have arrived
    done_at_end = starts_before[ends] - is_cont[ends]
    done_at_begin = starts_before[begins] - is_cont[begins]
    texts = [text[a:b] for a, b in zip(done_at_begin.tolist(), done_at_end.tolist(), strict=True)]
    return texts, done_at_begin


def _split_lenient(chunks: Sequence[bytes]) -> tuple[list[str], np.ndarray]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = [decoder.decode(chunk) for chunk in chunks]
    if texts:
        texts[-1] += decoder.decode(b"", final=True)
    return texts, _offsets(_lengths(texts))


def _encoded_if_same(
    tokens: Sequence[str], raw: Sequence[Any]
) -> tuple[list[bytes], np.ndarray, bytes] | None:
    """Encodings, byte lengths and joined bytes of the tokens, when they equal the API's bytes.

    That is the common case and needs no decoding: every token is whole characters.
    """
    try:
        encoded = [t.encode("utf-8") for t in tokens]
        lengths = _lengths(raw)
        if not np.array_equal(_lengths(encoded), lengths):
            return None
        joined = b"".join(encoded)
        same = bytes(chain.from_iterable(raw)) == joined
    except (UnicodeEncodeError, AttributeError, TypeError, ValueError):  # None, odd values
        return None
    return (encoded, lengths, joined) if same else None


def part_text(tokens: Sequence[str], raw: Sequence[Any]) -> PartText:
    """Per-token bytes, text, character offset and byte offset for the tokens of one part."""
    fast = _encoded_if_same(tokens, raw)
    if fast is not None:  # the text of each token is the token itself
        encoded, lengths, joined = fast
        texts = tokens if isinstance(tokens, list) else list(tokens)
        byte_offsets = _offsets(lengths)
        chars = byte_offsets.copy() if joined.isascii() else _offsets(_lengths(texts))
        return encoded, texts, chars, byte_offsets
    chunks = [
        token_bytes(t) if b is None else (b if isinstance(b, bytes) else bytes(b))
        for t, b in zip(tokens, raw, strict=True)
    ]
    lengths = _lengths(chunks)
    buf = b"".join(chunks)
    try:
        texts, chars = _split_strict(buf.decode("utf-8"), buf, lengths)
    except UnicodeDecodeError:
        texts, chars = _split_lenient(chunks)
    return chunks, texts, chars, _offsets(lengths)
