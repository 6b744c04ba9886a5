"""Single harmony tokens as (display string, raw bytes), for logprobs.

The harmony encoding decodes whole sequences; a single token that holds part of a UTF-8
character has no string of its own, so its raw bytes are read from the o200k vocabulary file
harmony itself loaded (``TIKTOKEN_ENCODINGS_BASE``). Such a token is displayed as
``bytes:\\xe6\\x97`` (OpenAI's convention, as ``families.text.TokenBytes`` does).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from openai_harmony import HarmonyEncoding

from nbresponses.families.harmony.vocab import ENV_VAR, VOCAB_NAME
from nbresponses.families.text import CachedTokenBytes


def read_ranks(path: Path) -> dict[int, bytes]:
    """rank -> token bytes from a tiktoken text file (``base64 rank`` per line)."""
    ranks: dict[int, bytes] = {}
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[int(rank)] = base64.b64decode(token)
    return ranks


class HarmonyTokenBytes(CachedTokenBytes):
    """Token bytes from the harmony encoding; the vocabulary file is read on first need."""

    def __init__(self, encoding: HarmonyEncoding, vocab: Path | None = None) -> None:
        super().__init__()
        self._enc = encoding
        self._vocab = vocab
        self._ranks: dict[int, bytes] | None = None

    def _raw(self, token_id: int) -> bytes:
        try:
            return self._enc.decode_utf8([token_id]).encode("utf-8")
        except Exception:  # part of a character (or not a token): ask the vocabulary
            pass
        if self._ranks is None:
            path = self._vocab or Path(os.environ.get(ENV_VAR, ".")) / VOCAB_NAME
            self._ranks = read_ranks(path) if path.is_file() else {}
        raw = self._ranks.get(token_id)
        return raw if raw is not None else self._enc.decode([token_id]).encode("utf-8")


def vocabulary_bytes(encoding: HarmonyEncoding, vocab: Path | None = None) -> list[bytes]:
    """Every id's bytes, for the grammar engine: the o200k ranks from the vocabulary file, then
    harmony's special tokens by name (``<|channel|>``, ``<|reserved_200000|>``, ...), which
    follow the ranks."""
    path = vocab or Path(os.environ.get(ENV_VAR, ".")) / VOCAB_NAME
    ranks = read_ranks(path)
    tokens = [ranks.get(i, b"") for i in range(max(ranks) + 1)]
    left = len(encoding.special_tokens_set)
    while left:
        token_id = len(tokens)
        if encoding.is_special_token(token_id):
            tokens.append(encoding.decode([token_id]).encode("utf-8"))
            left -= 1
        else:
            tokens.append(b"")
    return tokens
