"""Incremental detokenization: token ids in, text deltas out, never half a UTF-8 character.

Decoding each token alone is wrong twice over: byte-level tokens can hold part of a character,
and sentencepiece tokenizers drop or add spaces depending on the neighbours. The prefix-window
method (as in vLLM and TGI) decodes a short window before and after the new token and emits the
difference once it no longer ends in the replacement character.

Token bytes (a token's display string and raw bytes, for logprobs) and the conversion of the
engine's id-based logprobs to the protocol's live here too: families know tokenizers, the engine
speaks only token ids (``tokens/contract.py``) and the protocol only strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from nbresponses.protocol.events import TokenLogprob
from nbresponses.tokens.contract import TokenIdLogprob, Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's generated ids into text deltas made of whole characters."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # first id whose text has not been emitted
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=self._skip, clean_up_tokenization_spaces=False
        )

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty while a character waits)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            delta = after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of generation: emit whatever is left, replacement characters included."""
        if self._read >= len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        delta = after[len(before) :] if after.startswith(before) else after
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted (used by byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class CachedTokenBytes:
    """``get(token_id) -> (display string, byte values)`` of single tokens, cached, for logprobs.

    A token can be part of a character; its ``token`` string is then written ``bytes:\\xe6\\x97``
    (the convention OpenAI uses), while ``bytes`` always holds the raw bytes. Subclasses say
    where a token's raw bytes come from (``_raw``).
    """

    def __init__(self) -> None:
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _raw(self, token_id: int) -> bytes:
        raise NotImplementedError

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """(display string, byte values) of one token."""
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._raw(int(token_id))
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = (text, list(raw))
            self._cache[token_id] = hit
        return hit


class TokenBytes(CachedTokenBytes):
    """Token bytes from a transformers tokenizer (byte-level BPE or sentencepiece pieces)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__()
        self._tokenizer = tokenizer
        self._byte_level = _is_byte_level(tokenizer)

    def _raw(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return b""
        if self._byte_level:
            table = _byte_decoder()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])  # sentencepiece byte fallback
        if "\u2581" in piece:
            return piece.replace("\u2581", " ").encode("utf-8")
        return self._tokenizer.decode([int(token_id)]).encode("utf-8")


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


def protocol_logprob(lp: TokenIdLogprob, token_bytes: CachedTokenBytes) -> TokenLogprob:
    """An engine logprob (token ids) in protocol terms: display strings and bytes."""
    token, raw = token_bytes.get(lp.token_id)
    top = [(*token_bytes.get(t), v) for t, v in lp.top]
    processed = None if lp.processed is None else float(lp.processed)
    return TokenLogprob(
        token=token, bytes=raw, logprob=float(lp.logprob), top=top, processed_logprob=processed
    )
