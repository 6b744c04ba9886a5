"""Token logprobs as DataFrames: one row per generated token, and the long top-k form."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.access import field, getter
from nbresponses.traffic.lookup import ResponseLookup

from ._columns import categorical, nullable_int, repeat_categorical, string
from ._gc import gc_paused
from ._inputs import collect
from ._parts import Part, iter_parts
from ._topk import TopK, flat_tokens, row_stats, top_matrix
from ._utf8 import part_text

__all__ = ["LOGPROBS_COLUMNS", "TOP_LOGPROBS_COLUMNS", "logprobs_frame", "top_logprobs_frame"]

#: column -> dtype of :func:`logprobs_frame` (``category`` columns hold strings), in frame
#: order: what a reader looks at first (the token and its probability), the keys last (long
#: ids would otherwise fill the screen a notebook shows)
LOGPROBS_COLUMNS: dict[str, str] = {
    "token": "category",
    "prob": "float64",
    "logprob": "float64",
    "processed_logprob": "float64",
    "rank": "Int32",
    "runner_up": "category",
    "runner_up_logprob": "float64",
    "margin": "float64",
    "entropy": "float64",
    "topk_entropy": "float64",
    "topk_mass": "float64",
    "n_top": "int16",
    "given": "bool",
    "text": "str",
    "position": "int64",
    "output_index": "int32",
    "content_index": "int32",
    "bytes": "object",
    "byte_offset": "int64",
    "char_offset": "int64",
    "response_id": "category",
    "item_id": "category",
}

#: column -> dtype of :func:`top_logprobs_frame`
TOP_LOGPROBS_COLUMNS: dict[str, str] = {
    "response_id": "category",
    "item_id": "category",
    "output_index": "int32",
    "content_index": "int32",
    "position": "int64",
    "rank": "int16",
    "token": "category",
    "logprob": "float64",
    "prob": "float64",
    "chosen": "bool",
}

NO_LOGPROBS_HINT = (
    "no token logprobs found. Ask for them with "
    'responses.create(..., include=["message.output_text.logprobs"], top_logprobs=5) '
    "(top_logprobs: 0-20 alternatives per token)."
)


@dataclass
class _Tokens:
    """Raw per-token columns gathered from all parts, before any pandas work."""

    parts: list[Part]
    counts: np.ndarray
    token_list: list[Any]
    tokens: np.ndarray
    logprobs: np.ndarray
    raw_bytes: list[Any]
    tops: list[Any]
    ranks: np.ndarray  # exact ranks where the entries carry them (nbresponses' scorings), NaN
    entropies: np.ndarray  # full-vocabulary entropies where the entries carry them, NaN
    processed: np.ndarray  # logprobs under the distribution drawn from, where carried, NaN
    given: np.ndarray  # per token: given (a scoring, an echoed prompt) rather than generated


_ENTRY_FIELDS = ("token", "logprob", "bytes", "top_logprobs")


def _read_entries(entries: list[Any]) -> tuple[Sequence[Any], ...]:
    """token, logprob, bytes and top_logprobs columns of one part's logprob entries."""
    try:
        rows = list(map(getter(entries[0], *_ENTRY_FIELDS), entries))
        tokens, logprobs, raw, tops = zip(*rows, strict=True)
    except (KeyError, AttributeError, TypeError):  # deltas lack bytes; mixed or odd entries
        tokens = tuple(field(e, "token", "") for e in entries)
        logprobs = tuple(field(e, "logprob", math.nan) for e in entries)
        raw = tuple(field(e, "bytes") for e in entries)
        tops = tuple(field(e, "top_logprobs", ()) for e in entries)
    return tokens, logprobs, raw, tops  # tops may hold None: top_matrix copes


def _gather(obj: Any, lookup: ResponseLookup | None, choice: int | None = 0) -> _Tokens:
    parts = list(iter_parts(collect(obj, lookup=lookup, choice=choice)))
    tokens: list[Any] = []
    logprobs: list[Any] = []
    raw: list[Any] = []
    tops: list[Any] = []
    ranks: list[float] = []
    entropies: list[float] = []
    processed: list[float] = []
    given: list[bool] = []
    for part in parts:
        part_tokens, part_logprobs, part_raw, part_tops = _read_entries(part.entries)
        tokens += part_tokens
        logprobs += part_logprobs
        raw += part_raw
        tops += part_tops
        part_ranks, part_entropies = _read_details(part.entries)
        ranks += part_ranks
        entropies += part_entropies
        processed += _read_processed(part.entries)
        given += _read_given(part)
    token_array = np.empty(len(tokens), dtype=object)
    token_array[:] = tokens
    return _Tokens(
        parts=parts,
        counts=np.fromiter((len(p.entries) for p in parts), dtype=np.int64, count=len(parts)),
        token_list=tokens,
        tokens=token_array,
        logprobs=np.array(logprobs, dtype=np.float64),
        raw_bytes=raw,
        tops=tops,
        ranks=np.array(ranks, dtype=np.float64),
        entropies=np.array(entropies, dtype=np.float64),
        processed=np.array(processed, dtype=np.float64),
        given=np.array(given, dtype=bool),
    )


def _read_given(part: Part) -> list[bool]:
    """Whether each token was given: the part's flag (a scoring), or the entry's own ``given``
    (a Completions prompt echoed before the answer, ``nbresponses.traffic.legacy``)."""
    entries = part.entries
    if not entries or part.given or field(entries[0], "given") is None:
        return [part.given] * len(entries)
    return [bool(field(e, "given", False)) for e in entries]


def _read_details(entries: list[Any]) -> tuple[list[float], list[float]]:
    """Exact rank and entropy per entry: fields nbresponses' scorings add to OpenAI's logprob
    objects (NaN for entries without them, e.g. any generated answer; a remote server's
    scorings may carry ranks without entropies, as vLLM's prompt logprobs do). An echoed
    prompt's first token has no logprob and no rank: the second tells."""
    first = entries[0] if entries else None
    if first is not None and field(first, "logprob") is None and len(entries) > 1:
        first = entries[1]
    if first is None or (field(first, "entropy") is None and field(first, "rank") is None):
        return [math.nan] * len(entries), [math.nan] * len(entries)

    def number(entry: Any, name: str) -> float:
        value = field(entry, name)
        return math.nan if value is None else float(value)

    return [number(e, "rank") for e in entries], [number(e, "entropy") for e in entries]


def _read_processed(entries: list[Any]) -> list[float]:
    """Each entry's ``processed_logprob``: an extra field nbresponses adds with
    ``logprobs_mode="processed_logprobs"`` (NaN where absent)."""
    if not entries or field(entries[0], "processed_logprob") is None:
        return [math.nan] * len(entries)
    return [float(field(e, "processed_logprob", math.nan)) for e in entries]


def _part_columns(data: _Tokens, counts: np.ndarray) -> dict[str, Any]:
    """response_id, item_id, output_index, content_index repeated over ``counts`` rows/part."""
    parts = data.parts
    return {
        "response_id": repeat_categorical([p.response_id for p in parts], counts),
        "item_id": repeat_categorical([p.item_id for p in parts], counts),
        "output_index": np.repeat(np.array([p.output_index for p in parts], np.int32), counts),
        "content_index": np.repeat(np.array([p.content_index for p in parts], np.int32), counts),
    }


def _positions(counts: np.ndarray) -> np.ndarray:
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def _text_columns(data: _Tokens) -> dict[str, Any]:
    pieces = []
    start = 0
    for count in data.counts.tolist():
        stop = start + count
        whole = start == 0 and stop == len(data.token_list)
        tokens = data.token_list if whole else data.token_list[start:stop]
        raw = data.raw_bytes if whole else data.raw_bytes[start:stop]
        pieces.append(part_text(tokens, raw))
        start = stop
    if len(pieces) == 1:
        chunks, texts, chars, offsets = pieces[0]
    else:
        chunks = [c for piece in pieces for c in piece[0]]
        texts = [t for piece in pieces for t in piece[1]]
        chars = np.concatenate([np.zeros(0, np.int64), *(piece[2] for piece in pieces)])
        offsets = np.concatenate([np.zeros(0, np.int64), *(piece[3] for piece in pieces)])
    byte_column = np.empty(len(chunks), dtype=object)
    byte_column[:] = chunks
    return {
        "text": string(texts),
        "bytes": byte_column,
        "byte_offset": offsets,
        "char_offset": chars,
    }


def _warn_if_empty(n: int) -> None:
    if n == 0:
        warnings.warn(NO_LOGPROBS_HINT, UserWarning, stacklevel=3)


def logprobs_frame(
    obj: Any, *, lookup: ResponseLookup | None = None, choice: int | None = 0
) -> pd.DataFrame:
    """One row per generated token of every output_text part in ``obj``.

    ``obj``: a Response, a stream event, ``(time, event)`` pairs, JSON dicts of these, or any
    (nested) iterable mixing them. A stream gives the same frame as its folded Response
    (parts come from the terminal Response if present, else ``output_text.done``, else deltas).
    Chat Completions and legacy Completions answers are read too, from any server: a
    ``ChatCompletion`` (``choices[choice].logprobs.content``, and ``.refusal``), its stream
    (chunks, or the SDK's sync ``Stream``), a ``Completion`` (``logprobs.tokens`` /
    ``token_logprobs`` / ``top_logprobs``) or its stream; ``choice`` picks one of ``n > 1``
    choices (None: every choice, each keyed by a ``response_id`` ending in ``#index``). They
    give the rows a Responses answer with the same tokens gives (the message's text at
    ``output_index`` 0, after a reasoning item when the server streamed one; ``item_id`` is
    NA: these APIs have no item ids). A Completion made with ``echo=True``
    starts with its prompt's tokens, ``given`` True, the first with a NaN logprob (nothing
    predicts it); vLLM's ``prompt_logprobs`` add their ranks.
    Columns and dtypes are :data:`LOGPROBS_COLUMNS`; the index is a RangeIndex, rows are
    keyed by ``(response_id, output_index, content_index, position)``.

    Stored responses are read by id too: a ``"resp_..."`` id, a list of ids or an
    ``nbr.history()`` frame. ``lookup`` says where (anything with ``find(response_id)``: an
    engine, a client's store); without it, every response store of this process is asked, then
    the default store file (``nbresponses.traffic.lookup.stored``). An id found nowhere is a
    KeyError naming it and the places asked.

    ``text`` is what each token adds to the decoded text (a token holding part of a UTF-8
    character gets ``""`` and the token completing it gets the character), so
    ``"".join(text)`` over a part is its text and ``char_offset`` indexes into it. ``rank`` is
    1-based among the returned alternatives (NA when the token is not among them);
    ``runner_up`` is the likeliest other alternative, ``margin = logprob - runner_up_logprob``.
    ``topk_entropy = -Σ p·log p`` over the returned alternatives only (nats): a lower bound on
    the full-vocabulary entropy; ``topk_mass = Σ p`` says how much of the distribution they
    cover. Scorings of given text (``Engine.score``) carry more: ``rank`` is then exact over the
    whole vocabulary and ``entropy`` is the full distribution's (NaN otherwise); ``given`` says
    whether the tokens were given (a scoring) or generated. ``processed_logprob`` is the
    token's logprob under the distribution it was drawn from (after temperature, top-p and a
    grammar), for responses made with ``extra_body={"logprobs_mode": "processed_logprobs"}``
    (NaN otherwise); ``logprob`` stays the model's own. Without logprobs the frame is empty
    (full schema) and a ``UserWarning`` says how to request them.

    When ``obj`` is a Response whose output was held to a grammar (``text.format`` json_schema
    or json_object), ``frame.attrs["text_format"]`` names the format and
    ``frame.attrs["logprobs"]`` says which distribution the numbers are from: nbresponses
    reports the model's own, *before* the grammar mask (a token the grammar forced can have a
    low logprob; the tokens the mask removed still appear among the alternatives).
    """
    with gc_paused():
        data = _gather(obj, lookup, choice)
        _warn_if_empty(len(data.tokens))
        frame = pd.DataFrame(_token_columns(data), copy=False)
    fmt = getattr(getattr(getattr(obj, "text", None), "format", None), "type", None)
    if fmt in ("json_schema", "json_object"):
        frame.attrs["text_format"] = fmt
        frame.attrs["logprobs"] = BEFORE_MASK
    return frame


BEFORE_MASK = (
    "the model's distribution before the grammar mask (as nbresponses reports them; "
    "other servers may differ)"
)


def _token_columns(data: _Tokens) -> dict[str, Any]:
    stats = row_stats(top_matrix(data.tops, data.tokens, data.logprobs), data.logprobs)
    exact = ~np.isnan(data.ranks)
    ranks = np.where(exact, data.ranks, stats["rank"])
    part_columns = _part_columns(data, data.counts)
    columns = {
        **part_columns,
        "position": _positions(data.counts),
        "token": categorical(data.tokens),
        **_text_columns(data),
        "logprob": data.logprobs,
        "prob": np.exp(data.logprobs),
        "processed_logprob": data.processed,
        "rank": nullable_int(ranks, "Int32"),  # exact ranks reach the vocabulary size
        "n_top": stats["n_top"].astype(np.int16),
        "runner_up": categorical(stats["runner_up"]),
        "runner_up_logprob": stats["runner_up_logprob"],
        "margin": stats["margin"],
        "topk_entropy": stats["topk_entropy"],
        "topk_mass": stats["topk_mass"],
        "entropy": data.entropies,
        "given": data.given,
    }
    return {name: columns[name] for name in LOGPROBS_COLUMNS}


def _top_frame(data: _Tokens, top: TopK) -> pd.DataFrame:
    per_token = top.counts
    part_of_token = np.repeat(np.arange(len(data.parts)), data.counts)
    alternatives_per_part = np.bincount(
        part_of_token, weights=per_token, minlength=len(data.parts)
    ).astype(np.int64)
    rows, cols = top.rows, top.cols
    logprobs = top.matrix[rows, cols]
    columns = {
        **_part_columns(data, alternatives_per_part),
        "position": np.repeat(_positions(data.counts), per_token),
        "rank": top.rank[rows, cols].astype(np.int16),
        "token": categorical(flat_tokens(top)),
        "logprob": logprobs,
        "prob": np.exp(logprobs),
        "chosen": top.chosen[rows] == cols,
    }
    return pd.DataFrame(columns, copy=False)


def top_logprobs_frame(
    obj: Any, *, lookup: ResponseLookup | None = None, choice: int | None = 0
) -> pd.DataFrame:
    """Long form of the alternatives: one row per (token position, returned alternative).

    Same inputs as :func:`logprobs_frame`, ``lookup=`` too. Columns and dtypes are
    :data:`TOP_LOGPROBS_COLUMNS`; ``rank`` is 1-based by descending logprob and ``chosen``
    marks the generated token, so ``frame[frame.chosen]`` lines up with ``logprobs_frame(obj)`` on
    ``(response_id, output_index, content_index, position)``. RangeIndex.
    """
    with gc_paused():
        data = _gather(obj, lookup, choice)
        _warn_if_empty(len(data.tokens))
        return _top_frame(data, top_matrix(data.tops, data.tokens, data.logprobs))
