"""Words and spans: token surprisal summed into the units people read (words, char spans).

Psycholinguists and readers think in words, the model in subword pieces; this module maps
one onto the other with a stated rule, so the word rows add up exactly to the token rows.

**Which token belongs to which word.** A part's text is cut into words by ``boundary``; each
token then belongs to the first word that ends after the token starts: the word its text starts
in, or, for a token that starts in the gap between words (``" cat"``, a lone space), the next
word. This is the leading-space convention of BPE vocabularies (GPT-2, Llama 3, SmolLM): the
space before a word travels with the word's first token. Tokens after the last word (trailing
whitespace, an end-of-text token) belong to the last word. So every token of a part with at
least one word counts for exactly one word and the word sums add up to the part's sum. A token
that runs into the next word (``"dog."`` when the punctuation rule makes ``"."`` a word) still
counts once, for the word it starts in; both words are then marked ``clean = False``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from ._bow import bow_terms, span_term, word_start_masses
from .logprobs import logprobs_frame

__all__ = ["BOUNDARIES", "WORDS_COLUMNS", "span_surprisal", "words_frame"]

_PART = ["response_id", "output_index", "content_index"]

#: the word rules by name: a regular expression whose matches are the words
BOUNDARIES: dict[str, re.Pattern[str]] = {
    # a word is a run of non-whitespace characters: "dog." and "don't" are one word each
    "whitespace": re.compile(r"\S+"),
    # a word is a run of letters, digits and underscores; each other visible character
    # (punctuation, symbols) is a word of its own: "dog", ".", "don", "'", "t"
    "punctuation": re.compile(r"\w+|[^\w\s]"),
}

#: column -> dtype of :func:`words_frame`, in frame order
WORDS_COLUMNS: dict[str, str] = {
    "word": "int64",
    "text": "str",
    "surprisal": "float64",
    "surprisal_bits": "float64",
    "logprob": "float64",
    "tokens": "int64",
    "char_start": "int64",
    "char_end": "int64",
    "first_position": "int64",
    "last_position": "int64",
    "clean": "bool",
    "response_id": "category",
    "output_index": "int32",
    "content_index": "int32",
}

Boundary = str | re.Pattern[str]
Segmentation = Sequence[str] | Sequence[Sequence[str]] | None


def _token_frame(obj: Any, lookup: ResponseLookup | None, choice: int | None = 0) -> pd.DataFrame:
    if isinstance(obj, pd.DataFrame):
        frame = obj
    else:
        frame = logprobs_frame(obj, lookup=lookup, choice=choice)
    missing = {"logprob", "text", "char_offset", "position", *_PART} - set(frame.columns)
    if missing:
        raise ValueError(f"not a logprobs frame: it lacks {sorted(missing)}")
    return frame


def _parts(frame: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The frame's parts (one output_text each), in frame order, rows by position."""
    grouped = frame.groupby(_PART, observed=True, sort=False, dropna=False)
    return [
        (key, part.sort_values("position", kind="stable"))
        for key, part in grouped
        if len(part)  # groupby over categoricals may list empty combinations
    ]


def _pattern(boundary: Boundary) -> re.Pattern[str]:
    if isinstance(boundary, re.Pattern):
        return boundary
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {sorted(BOUNDARIES)} or a compiled regex")
    return BOUNDARIES[boundary]


def _find_words(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """Char spans of user-given words, found in order (what lies between them is no word)."""
    spans = []
    at = 0
    for word in words:
        if not word:
            raise ValueError("a given word is empty")
        start = text.find(word, at)
        if start < 0:
            raise ValueError(f"word {word!r} not found in the text after char {at}: {text!r}")
        spans.append((start, start + len(word)))
        at = start + len(word)
    return spans


def _segmentations(words: Segmentation, n_parts: int) -> list[Sequence[str] | None]:
    """One list of words per part (a flat list is the segmentation of a single part)."""
    if words is None:
        return [None] * n_parts
    if all(isinstance(w, str) for w in words):
        flat: list[Sequence[str] | None] = [list(words)]  # type: ignore[arg-type]
    else:
        flat = [list(w) for w in words]
    if len(flat) != n_parts:
        raise ValueError(f"{len(flat)} segmentations for {n_parts} parts with logprobs")
    return flat


def _owners(starts: np.ndarray, ends: np.ndarray, token_starts: np.ndarray) -> np.ndarray:
    """The word each token belongs to: the first word ending after the token starts."""
    owner = np.searchsorted(ends, token_starts, side="right")
    return np.minimum(owner, len(ends) - 1)


def _part_words(
    part: pd.DataFrame, spans: list[tuple[int, int]], text: str, key: tuple[Any, ...]
) -> tuple[pd.DataFrame, np.ndarray]:
    """The word rows of one part, and each token's word."""
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    token_starts = part["char_offset"].to_numpy(dtype=np.int64)
    token_ends = token_starts + part["text"].str.len().to_numpy(dtype=np.int64)
    owner = _owners(starts, ends, token_starts)
    logprob = part["logprob"].to_numpy(dtype=np.float64)
    positions = part["position"].to_numpy(dtype=np.int64)
    n = len(spans)
    sums = np.bincount(owner, weights=logprob, minlength=n)
    counts = np.bincount(owner, minlength=n)
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    last = np.full(n, -1, np.int64)
    np.minimum.at(first, owner, positions)
    np.maximum.at(last, owner, positions)
    first[counts == 0] = -1
    # a token reaching into the next word's characters makes both words unclean
    nxt = owner + 1
    straddles = (nxt < n) & (token_ends > starts[np.minimum(nxt, n - 1)])
    clean = np.ones(n, bool)
    clean[owner[straddles]] = False
    clean[nxt[straddles]] = False
    clean[counts == 0] = False  # a word inside one token of another word
    rows = pd.DataFrame(
        {
            "word": np.arange(n, dtype=np.int64),
            "text": pd.array([text[s:e] for s, e in spans], dtype="str"),
            "surprisal": -sums,
            "surprisal_bits": -sums / math.log(2),
            "logprob": sums,
            "tokens": counts.astype(np.int64),
            "char_start": starts,
            "char_end": ends,
            "first_position": first,
            "last_position": last,
            "clean": clean,
            "response_id": key[0],
            "output_index": np.int32(key[1]),
            "content_index": np.int32(key[2]),
        }
    )
    return rows, owner


def _word_spans(
    text: str, pattern: re.Pattern[str], given: Sequence[str] | None
) -> list[tuple[int, int]]:
    if given is not None:
        return _find_words(text, given)
    return [m.span() for m in pattern.finditer(text) if m.end() > m.start()]


def _each_part(
    obj: Any,
    boundary: Boundary,
    words: Segmentation,
    bow_correction: bool = False,
    lookup: ResponseLookup | None = None,
    choice: int | None = 0,
) -> list[tuple[pd.DataFrame, pd.DataFrame, np.ndarray]]:
    """(token rows, word rows, token -> word) per part with at least one word."""
    frame = _token_frame(obj, lookup, choice)
    parts = _parts(frame)
    pattern = _pattern(boundary)
    if bow_correction and words is None and boundary != "whitespace":
        raise ValueError("bow_correction assumes words end at whitespace: boundary='whitespace'")
    masses = word_start_masses(obj, lookup) if bow_correction else {}
    out = []
    for (key, part), given in zip(parts, _segmentations(words, len(parts)), strict=True):
        text = "".join(part["text"].astype(str))
        spans = _word_spans(text, pattern, given)
        if spans:
            rows, owner = _part_words(part, spans, text, key)
            if bow_correction:
                terms = bow_terms(part, rows, masses.get(_ident(key)))
                rows["logprob"] = rows["logprob"] + terms
                rows["surprisal"] = -rows["logprob"]
                rows["surprisal_bits"] = rows["surprisal"] / math.log(2)
                rows["bow_correction"] = terms
            out.append((part, rows, owner))
    return out


def _ident(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A part's (response_id, output_index, content_index) as the parts of a Response name it."""
    return (None if pd.isna(key[0]) else str(key[0]), int(key[1]), int(key[2]))


def _empty_words() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in WORDS_COLUMNS.items()})


def words_frame(
    obj: Any,
    *,
    boundary: Boundary = "whitespace",
    words: Segmentation = None,
    bow_correction: bool = False,
    lookup: ResponseLookup | None = None,
    choice: int | None = 0,
) -> pd.DataFrame:
    """One row per word of every output_text part: ``text``, char span, summed ``surprisal``
    (nats; ``surprisal_bits``), ``logprob`` (the sum), ``tokens`` and the ``first_position``
    / ``last_position`` of its tokens (the rows of ``logprobs_frame``).

    ``obj``: anything :func:`logprobs_frame` takes (scorings, generations, streams, stored ids
    read through ``lookup=``), or that frame. ``boundary``: ``"whitespace"`` (a word is a run
    of non-space characters), ``"punctuation"`` (runs of letters/digits, each punctuation mark
    its own word; see :data:`BOUNDARIES`) or a compiled regex whose matches are the words.
    ``words``: your own segmentation instead (for languages written without spaces, or a
    stimulus's regions), a list of words per part (a flat list for a single part), found in
    the text in order; characters between them belong to no word. The token-to-word rule is
    the module's: every token counts for exactly one word, so per part the word sums equal the
    token sums; a word whose edges fall inside a token has ``clean = False``. Parts without any
    word give no rows.

    ``bow_correction=True``: each word's probability includes that a new word follows it (the
    module docstring: Pimentel & Meister 2024, minicons' ``bow_correction``); ``logprob`` and
    the surprisals are then corrected and ``bow_correction`` holds the term added (0 for a word
    without tokens of its own). Needs scorings made with ``engine.score(...,
    word_starts=True)``. ``choice``: which choice of a Chat Completions or Completions answer
    (as for :func:`logprobs_frame`).
    """
    parts = _each_part(obj, boundary, words, bow_correction, lookup, choice)
    if not parts:
        return _empty_words()
    out = pd.concat([rows for _, rows, _ in parts], ignore_index=True)
    out["response_id"] = out["response_id"].astype("category")
    return out


def span_surprisal(
    obj: Any,
    start: int,
    stop: int,
    *,
    unit: str = "char",
    boundary: Boundary = "whitespace",
    words: Segmentation = None,
    bow_correction: bool = False,
    lookup: ResponseLookup | None = None,
    choice: int | None = 0,
) -> pd.DataFrame:
    """The surprisal of a slice of each part's text: chars ``[start, stop)`` (``unit="char"``)
    or words ``[start, stop)`` (``unit="word"``, numbered as in :func:`words_frame`).

    One row per part: ``text`` (the slice), ``surprisal`` (nats), ``surprisal_bits``,
    ``logprob``, ``tokens``, ``first_position``, ``last_position``. A token counts for the
    slice when the char it is counted at lies inside it: its first char, moved into the word
    it belongs to (the module's rule; a leading space counts at its word's first char). So a
    word slice sums exactly its words' rows and adjacent slices never count a token twice.
    Negative indices count from the end. ``bow_correction=True`` applies the module's
    correction to the span as to one word (scorings made with ``word_starts=True``).
    ``obj``, ``lookup`` and ``choice`` as for :func:`words_frame`.
    """
    if unit not in ("char", "word"):
        raise ValueError("unit must be 'char' or 'word'")
    if bow_correction and words is None and boundary != "whitespace":
        raise ValueError("bow_correction assumes words end at whitespace: boundary='whitespace'")
    masses = word_start_masses(obj, lookup) if bow_correction else {}
    rows = []
    for part, word_rows, owner in _each_part(obj, boundary, words, lookup=lookup, choice=choice):
        text = "".join(part["text"].astype(str))
        starts = word_rows["char_start"].to_numpy()
        ends = word_rows["char_end"].to_numpy()
        if unit == "word":
            first_word, stop_word, _ = slice(start, stop).indices(len(word_rows))
            if stop_word <= first_word:
                lo = hi = 0
            else:
                lo, hi = int(starts[first_word]), int(ends[stop_word - 1])
        else:
            lo, hi, _ = slice(start, stop).indices(len(text))
        anchors = _anchors(part, owner, starts, ends)
        inside = (anchors >= lo) & (anchors < hi)
        logprob = float(part["logprob"].to_numpy(dtype=np.float64)[inside].sum())
        positions = part["position"].to_numpy()[inside]
        if bow_correction and inside.any():
            ident = _ident(tuple(word_rows[_PART].iloc[0]))
            rows_inside = np.flatnonzero(inside)
            logprob += span_term(part, masses.get(ident), rows_inside[0], rows_inside[-1])
        rows.append(
            {
                "text": text[lo:hi],
                "char_start": lo,
                "char_end": max(lo, hi),
                "surprisal": -logprob,
                "surprisal_bits": -logprob / math.log(2),
                "logprob": logprob,
                "tokens": int(inside.sum()),
                "first_position": int(positions.min()) if len(positions) else -1,
                "last_position": int(positions.max()) if len(positions) else -1,
                "response_id": word_rows["response_id"].iloc[0],
                "output_index": int(word_rows["output_index"].iloc[0]),
                "content_index": int(word_rows["content_index"].iloc[0]),
            }
        )
    return pd.DataFrame(rows)


def _anchors(
    part: pd.DataFrame, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """The char each token is counted at: its start, moved into its word (a leading space
    counts at the word's first char, trailing whitespace at the last word's last char)."""
    token_starts = part["char_offset"].to_numpy(dtype=np.int64)
    return np.clip(token_starts, starts[owner], ends[owner] - 1)
