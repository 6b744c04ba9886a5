"""The BOW correction's inputs: each position's probability that a word starts there.

Scorings made with ``engine.score(..., word_starts=True)`` carry, per token, the log of the
probability of any token beginning with whitespace (or end-of-text) at that position, and
after the last token; ``words_frame(..., bow_correction=True)`` turns them into one term per
word (the formula is in ``words``' docstring).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.access import field
from nbresponses.traffic.lookup import ResponseLookup

from ._inputs import collect
from ._parts import iter_parts

__all__ = ["BOW_HINT", "bow_terms", "span_term", "word_start_masses"]

#: a token whose bytes begin with one of these starts a word (as analysis/word_starts.py counts)
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")

BOW_HINT = (
    "bow_correction needs each position's word-start probability: pass the scorings (not a "
    "frame) made with engine.score(..., word_starts=True)"
)


def word_start_masses(
    obj: Any, lookup: ResponseLookup | None = None
) -> dict[tuple[Any, ...], tuple[np.ndarray, float]]:
    """Per part (response_id, output_index, content_index): log B at each token, and after."""
    if isinstance(obj, pd.DataFrame):
        raise ValueError(BOW_HINT)
    out = {}
    for part in iter_parts(collect(obj, lookup=lookup)):
        values = [field(e, "word_start_logmass") for e in part.entries]
        after = field(part.entries[-1], "word_start_logmass_after") if part.entries else None
        if after is None or any(v is None for v in values):
            raise ValueError(BOW_HINT)
        key = (part.response_id, part.output_index, part.content_index)
        out[key] = (np.array(values, dtype=np.float64), float(after))
    return out


def span_term(part: pd.DataFrame, masses: tuple[np.ndarray, float] | None, i: int, j: int) -> float:
    """log B(after token j) - [log B(at token i) when token i starts with whitespace]: the term
    for a word or span made of the part's rows i..j (rows by position)."""
    if masses is None or len(masses[0]) != len(part):
        raise ValueError(BOW_HINT)
    at, after = masses
    raw = part["bytes"].iat[i]
    starts_word = len(raw) > 0 and raw[0] in _WHITESPACE
    following = at[j + 1] if j + 1 < len(at) else after
    return float(following - (at[i] if starts_word else 0.0))


def bow_terms(
    part: pd.DataFrame, rows: pd.DataFrame, masses: tuple[np.ndarray, float] | None
) -> np.ndarray:
    """:func:`span_term` per word row of one part (0 for a word without tokens of its own);
    ``masses``: that part's, from :func:`word_start_masses`."""
    if masses is None or len(masses[0]) != len(part):
        raise ValueError(BOW_HINT)
    first = rows["first_position"].to_numpy()
    last = rows["last_position"].to_numpy()
    row_of = {p: i for i, p in enumerate(part["position"].to_numpy().tolist())}
    terms = np.zeros(len(rows))
    for w in np.flatnonzero(first >= 0):
        terms[w] = span_term(part, masses, row_of[int(first[w])], row_of[int(last[w])])
    return terms
