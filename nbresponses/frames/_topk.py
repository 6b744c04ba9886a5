"""Top-k alternatives as an (n_tokens, k) logprob matrix, and per-token statistics from it.

A million tokens with five alternatives each must cost a few numpy calls, so the alternatives'
logprobs are read once into a matrix and token strings are read only where needed: to confirm
which alternative is the generated token and to name the runner-up.
Ranks are 1-based by descending logprob; ties keep API order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import getitem
from typing import Any

import numpy as np

from nbresponses.traffic.access import field, getter

__all__ = ["TopK", "flat_tokens", "row_stats", "top_matrix"]


@dataclass
class TopK:
    """The alternatives of n tokens."""

    tops: Sequence[Sequence[Any]]  # per token, its alternative entries (dicts or objects)
    counts: np.ndarray  # alternatives per token
    matrix: np.ndarray  # (n, kmax) logprobs, NaN padded
    rank: np.ndarray  # (n, kmax) 1-based rank of each alternative
    chosen: np.ndarray  # (n,) column of the generated token among its alternatives, or -1

    @property
    def rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.counts)), self.counts)

    @property
    def cols(self) -> np.ndarray:
        starts = np.cumsum(self.counts) - self.counts
        return np.arange(int(self.counts.sum())) - np.repeat(starts, self.counts)


def _read(entries: Any, name: str, default: Any) -> list[Any]:
    """``entry.name`` for every entry of the iterable ``entries`` (dicts or objects)."""
    entries = list(entries) if not isinstance(entries, list) else entries
    if not entries:
        return []
    try:
        return list(map(getter(entries[0], name), entries))
    except (KeyError, AttributeError, TypeError):  # missing fields, or dicts mixed with objects
        return [field(e, name, default) for e in entries]


def _token_at(tops: Sequence[Sequence[Any]], rows: np.ndarray, cols: np.ndarray) -> list[Any]:
    """``tops[row][col].token`` for each pair; loops in C, each entry touched once."""
    if not len(rows):
        return []

    def entries() -> Any:
        lists = tops if len(rows) == len(tops) else map(tops.__getitem__, rows.tolist())
        return map(getitem, lists, cols.tolist())

    sample = tops[int(rows[0])][int(cols[0])]
    try:
        return list(map(getter(sample, "token"), entries()))
    except (KeyError, AttributeError, TypeError):
        return [field(e, "token") for e in entries()]


def _logprob_matrix(tops: Sequence[Sequence[Any]], counts: np.ndarray) -> np.ndarray:
    n, total = len(counts), int(counts.sum())
    kmax = int(counts.max()) if n else 0
    values = np.empty(total, dtype=np.float64)
    if total:
        sample = next(chain.from_iterable(tops))
        try:
            entries = chain.from_iterable(tops)
            values[:] = np.fromiter(map(getter(sample, "logprob"), entries), np.float64, total)
        except (KeyError, AttributeError, TypeError, ValueError):
            flat = list(chain.from_iterable(tops))
            values[:] = np.array([field(e, "logprob", math.nan) for e in flat], np.float64)
    if total == n * kmax:
        return values.reshape(n, kmax)
    matrix = np.full((n, kmax), np.nan)
    starts = np.cumsum(counts) - counts
    matrix[np.repeat(np.arange(n), counts), np.arange(total) - np.repeat(starts, counts)] = values
    return matrix


def _find_chosen(
    tops: Sequence[Sequence[Any]], matrix: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray
) -> np.ndarray:
    """Column of the generated token among its alternatives (-1 when absent).

    Found by logprob: the alternative with exactly the generated token's logprob. Where
    several alternatives share that value the token text decides, and where none does (a
    token sampled outside the top k, or a server that rounds differently) the row is searched
    by token text. Reading every alternative's text would double the cost of a large frame.
    """
    n = len(tokens)
    chosen = np.full(n, -1, dtype=np.int64)
    if not matrix.size:
        return chosen
    equal = matrix == logprobs[:, None]
    matches = equal.sum(axis=1)
    unique = np.flatnonzero(matches == 1)
    chosen[unique] = equal[unique].argmax(axis=1)
    # ties with another token, or no logprob match: decide these few rows by token text
    for i in np.flatnonzero((matches != 1) & (top_counts(matrix) > 0)).tolist():
        for j, entry in enumerate(tops[i]):
            if field(entry, "token") == tokens[i]:
                chosen[i] = j
                break
    return chosen


def top_counts(matrix: np.ndarray) -> np.ndarray:
    """Number of alternatives per row of a NaN-padded logprob matrix."""
    return (~np.isnan(matrix)).sum(axis=1)


def _ranks(matrix: np.ndarray) -> np.ndarray:
    """1-based rank of each alternative; APIs send them sorted, which skips the sort."""
    n, kmax = matrix.shape
    filled = np.where(np.isnan(matrix), -np.inf, matrix)
    if (filled[:, :-1] >= filled[:, 1:]).all():
        return np.broadcast_to(np.arange(1, kmax + 1, dtype=np.int64), (n, kmax))
    order = np.argsort(-matrix, axis=1, kind="stable")  # NaN padding sorts last
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(1, kmax + 1)[None, :], axis=1)
    return rank


def top_matrix(tops: Sequence[Sequence[Any]], tokens: np.ndarray, logprobs: np.ndarray) -> TopK:
    """Read the alternatives of n tokens into a :class:`TopK`."""
    n = len(tops)
    try:
        counts = np.fromiter(map(len, tops), dtype=np.int64, count=n)
    except TypeError:  # None where a token has no alternatives (stream deltas)
        tops = [t or () for t in tops]
        counts = np.fromiter(map(len, tops), dtype=np.int64, count=n)
    matrix = _logprob_matrix(tops, counts)
    rank = _ranks(matrix)
    chosen = _find_chosen(tops, matrix, tokens, logprobs)
    return TopK(tops=tops, counts=counts, matrix=matrix, rank=rank, chosen=chosen)


def flat_tokens(top: TopK) -> list[Any]:
    """Token of every alternative, flattened in input order."""
    return _read(list(chain.from_iterable(top.tops)), "token", None)


def row_stats(top: TopK, logprobs: np.ndarray) -> dict[str, Any]:
    """rank, runner-up, margin, top-k entropy and mass of each generated token."""
    n, kmax = top.matrix.shape
    has_top = top.counts > 0
    padded = np.isnan(top.matrix)
    in_top = np.flatnonzero(top.chosen >= 0)
    rank = np.full(n, np.nan)
    rank[in_top] = top.rank[in_top, top.chosen[in_top]]
    others = np.where(padded, -np.inf, top.matrix)
    others[in_top, top.chosen[in_top]] = -np.inf
    best = others.argmax(axis=1) if kmax else np.zeros(n, dtype=np.int64)
    runner_lp = others[np.arange(n), best] if kmax else np.full(n, -np.inf)
    finite = np.isfinite(runner_lp)
    has_runner = np.flatnonzero(finite)
    runner = np.full(n, None, dtype=object)
    runner[has_runner] = _token_at(top.tops, has_runner, best[has_runner])
    runner_lp[~finite] = np.nan
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(top.matrix)
        terms = -p * top.matrix
    terms[padded | (p == 0)] = 0.0  # 0·log 0 = 0; padding contributes nothing
    p[padded] = 0.0
    return {
        "rank": rank,
        "n_top": top.counts,
        "runner_up": runner,
        "runner_up_logprob": runner_lp,
        "margin": logprobs - runner_lp,
        "topk_entropy": np.where(has_top, terms.sum(axis=1), np.nan),
        "topk_mass": np.where(has_top, p.sum(axis=1), np.nan),
    }
