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

from ._fold import iter_parts
from ._inputs import collect

__all__ = ["BOW_HINT", "bow_terms", "word_start_masses"]

#: a token whose bytes begin with one of these starts a word (as service/word_starts.py counts)
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")

BOW_HINT = (
    "bow_correction needs each position's word-start probability: pass the scorings (not a "
    "frame) made with engine.score(..., word_starts=True)"
)


def word_start_masses(obj: Any) -> dict[tuple[Any, ...], tuple[np.ndarray, float]]:
    """Per part (response_id, output_index, content_index): log B at each token, and after."""
    if isinstance(obj, pd.DataFrame):
        raise ValueError(BOW_HINT)
    out = {}
    for part in iter_parts(collect(obj)):
        values = [field(e, "word_start_logmass") for e in part.entries]
        after = field(part.entries[-1], "word_start_logmass_after") if part.entries else None
        if after is None or any(v is None for v in values):
            raise ValueError(BOW_HINT)
        key = (part.response_id, part.output_index, part.content_index)
        out[key] = (np.array(values, dtype=np.float64), float(after))
    return out


def bow_terms(
    part: pd.DataFrame, rows: pd.DataFrame, masses: tuple[np.ndarray, float] | None
) -> np.ndarray:
    """log B(after w) - [log B(start of w) when w's first token starts with whitespace], per
    word row of one part (``masses``: that part's, from :func:`word_start_masses`)."""
    if masses is None:
        raise ValueError(BOW_HINT)
    at, after = masses
    n_tokens = len(part)
    if len(at) != n_tokens:
        raise ValueError(BOW_HINT)
    at_next = np.append(at, after)
    first = rows["first_position"].to_numpy()
    last = rows["last_position"].to_numpy()
    own = first >= 0
    position_to_row = {p: i for i, p in enumerate(part["position"].to_numpy().tolist())}
    raw = part["bytes"].to_numpy()
    terms = np.zeros(len(rows))
    for w in np.flatnonzero(own):
        i, j = position_to_row[int(first[w])], position_to_row[int(last[w])]
        starts_word = len(raw[i]) > 0 and raw[i][0] in _WHITESPACE
        terms[w] = at_next[j + 1] - (at[i] if starts_word else 0.0)
    return terms
