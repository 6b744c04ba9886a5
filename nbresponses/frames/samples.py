"""The distribution of many completions of one prompt: one row per distinct answer."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.access import field
from nbresponses.traffic.lookup import ResponseLookup

from ._inputs import CollectedResponse, collect
from ._parts import parts_of_response
from ._streams import stream_response

__all__ = ["SAMPLES_COLUMNS", "samples_frame"]

#: column -> dtype of :func:`samples_frame`
SAMPLES_COLUMNS: dict[str, str] = {
    "answer": "str",
    "count": "int64",
    "frequency": "float64",
    "distinct": "int64",
    "sequence_logprob": "float64",
    "sequence_processed_logprob": "float64",
    "diverges_at": "Int64",
    "example": "str",
    "seeds": "object",
    "response_ids": "object",
}


@dataclass(frozen=True)
class _Completion:
    """What the frame needs of one response: its text, tokens and sums of logprobs."""

    response_id: str | None
    seed: int | None
    text: str
    tokens: tuple[str, ...] | None  # None: the response carries no token logprobs
    logprob: float
    processed: float


def _completion(response: Any) -> _Completion:
    texts = []
    for item in field(response, "output", ()):
        if field(item, "type") == "message":
            for content in field(item, "content", ()):
                if field(content, "type") == "output_text":
                    texts.append(field(content, "text", ""))
    entries = [e for part in parts_of_response(response) for e in part.entries]
    seed = field(response, "seed")
    if not entries:
        return _Completion(field(response, "id"), seed, "".join(texts), None, math.nan, math.nan)
    return _Completion(
        response_id=field(response, "id"),
        seed=seed,
        text="".join(texts),
        tokens=tuple(str(field(e, "token", "")) for e in entries),
        logprob=math.fsum(float(field(e, "logprob", math.nan)) for e in entries),
        processed=math.fsum(float(field(e, "processed_logprob", math.nan)) for e in entries),
    )


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _logsumexp(values: list[float]) -> float:
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    peak = max(values)
    if peak == -math.inf:
        return -math.inf
    return peak + math.log(math.fsum(math.exp(v - peak) for v in values))


def samples_frame(
    obj: Any,
    normalize: Callable[[str], Any] | None = None,
    *,
    lookup: ResponseLookup | None = None,
) -> pd.DataFrame:
    """Count the completions of one prompt (``Engine.sample``, or any Responses, or their
    stored ids read through ``lookup=`` as for :func:`logprobs_frame`, or the ``n`` choices of
    a Chat Completions or Completions answer, each a completion): one row per distinct
    answer, most frequent first. Columns and dtypes are :data:`SAMPLES_COLUMNS`.

    ``answer`` is the completion's text, or ``normalize(text)`` when a function is given (e.g.
    the extracted final answer: completions whose answers are equal share a row);
    ``count`` and ``frequency`` (count / number of completions) say how often it came;
    ``distinct`` how many different texts gave it and ``example`` the most frequent one.
    ``sequence_logprob`` is the model's log-probability of the answer's text (the sum of its
    tokens' raw logprobs; for a row of several texts, the log of the sum of their
    probabilities) and ``sequence_processed_logprob`` the same under the distributions the
    tokens were drawn from (``logprobs_mode="processed_logprobs"``; NaN otherwise).
    ``diverges_at`` is the token position where the answer's completions part from all
    others' (the longest token prefix one of them shares with a completion of another answer;
    NA for a lone answer or without logprobs). ``seeds`` and ``response_ids`` list the
    completions of each row.

    ``frame.attrs``: ``n`` (completions), ``entropy`` (of the empirical distribution of the
    answers, nats: ``-Σ frequency · ln frequency``) and ``first_divergence`` (the token
    position where the completions first differ: the longest prefix they all share; None
    without logprobs).
    """
    completions = []
    for entry in collect(obj, lookup=lookup, choice=None):  # every choice of an n > 1 answer
        response = (
            entry.response if isinstance(entry, CollectedResponse) else stream_response(entry)
        )
        if response is not None:
            completions.append(_completion(response))
    groups: dict[Any, list[_Completion]] = {}
    for c in completions:
        groups.setdefault(c.text if normalize is None else normalize(c.text), []).append(c)
    n = len(completions)
    token_lists = {c.text: c.tokens for c in completions}  # one token sequence per text
    known = all(tokens is not None for tokens in token_lists.values())
    rows: list[dict[str, Any]] = []
    for answer, members in groups.items():
        texts: dict[str, _Completion] = {}
        counts: dict[str, int] = {}
        for c in members:
            texts.setdefault(c.text, c)
            counts[c.text] = counts.get(c.text, 0) + 1
        diverges: int | None = None
        outsiders = [t for t in token_lists if t not in texts]
        if known and outsiders:
            diverges = max(
                _common_prefix(token_lists[a] or (), token_lists[b] or ())
                for a in texts
                for b in outsiders
            )
        rows.append(
            {
                "answer": str(answer),
                "count": len(members),
                "frequency": len(members) / n,
                "distinct": len(texts),
                "sequence_logprob": _logsumexp([c.logprob for c in texts.values()]),
                "sequence_processed_logprob": _logsumexp([c.processed for c in texts.values()]),
                "diverges_at": diverges,
                "example": max(counts, key=lambda t: counts[t]),
                "seeds": [c.seed for c in members],
                "response_ids": [c.response_id for c in members],
            }
        )
    rows.sort(key=lambda r: (-r["count"], -_orderable(r["sequence_logprob"]), r["answer"]))
    frame = pd.DataFrame(
        {
            name: pd.Series([r[name] for r in rows], dtype=dtype)
            if dtype != "object"
            else pd.Series([r[name] for r in rows], dtype=object)
            for name, dtype in SAMPLES_COLUMNS.items()
        }
    )
    freq = np.array([r["frequency"] for r in rows], np.float64)
    frame.attrs["n"] = n
    frame.attrs["entropy"] = float(-(freq * np.log(freq)).sum()) if n else math.nan
    frame.attrs["first_divergence"] = (
        min(_common_prefix(token_lists[a] or (), token_lists[b] or ()) for a in token_lists
            for b in token_lists)
        if known and token_lists
        else None
    )  # fmt: skip
    return frame


def _orderable(value: float) -> float:
    return -math.inf if math.isnan(value) else value
