"""The probability that the next token starts a new word, for the BOW correction of words.

BPE vocabularies with a leading-space convention mark a word's *start* (``" cat"``), so the
end of a word is only known when the next token begins with a space: the probability of a word
is its tokens' probability times the probability that a word-start token (or the end of text)
follows, divided by that probability where the word began (Pimentel & Meister 2024, "How to
Compute the Probability of a Word"; minicons' ``bow_correction``). Those masses need the whole
distribution at each position: computed here from the engine's full log-softmax and kept as a
single float per token.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from nbresponses.families.base import Family
from nbresponses.tokens.contract import TokenIdLogprob

__all__ = ["WHITESPACE_BYTES", "word_start_logmass", "word_start_mask"]

#: a token whose bytes begin with one of these starts a word
WHITESPACE_BYTES = frozenset(b" \t\n\r\x0b\x0c")

_MASKS: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def word_start_mask(family: Family, vocab_size: int, eos_ids: Sequence[int]) -> np.ndarray:
    """Token ids that start a word: their bytes begin with whitespace; and end-of-text (a word
    also ends with the text). Cached per family (one pass over the vocabulary)."""
    key = (vocab_size, tuple(int(i) for i in eos_ids))
    cached = _MASKS.setdefault(family, {})
    if key not in cached:
        mask = np.zeros(vocab_size, bool)
        for token_id in range(vocab_size):
            try:
                raw = family.token_logprob(TokenIdLogprob(token_id, 0.0)).bytes
            except (IndexError, KeyError, ValueError, TypeError):  # ids past the tokenizer's
                continue
            mask[token_id] = bool(raw) and raw[0] in WHITESPACE_BYTES
        mask[[i for i in key[1] if 0 <= i < vocab_size]] = True
        cached[key] = mask
    return cached[key]


def word_start_logmass(distribution: np.ndarray, mask: np.ndarray) -> float:
    """log Σ p over the word-start tokens, in float64, from a log-softmax vector."""
    values = distribution[mask].astype(np.float64)
    if values.size == 0:
        return float("-inf")
    top = values.max()
    return float(top + np.log(np.exp(values - top).sum()))
