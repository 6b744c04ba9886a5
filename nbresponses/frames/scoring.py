"""Two scorings of one text compared per token; many scorings as one frame of documents.

Both read logprobs the way ``logprobs_frame`` does, so they take scorings (``Engine.score``)
and generated Responses alike, from this engine or any other.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from .choice import option_likelihoods
from .logprobs import logprobs_frame, top_logprobs_frame

__all__ = ["compare", "compare_scorings", "option_likelihoods", "scorings_frame"]


def compare_scorings(
    a: Any,
    b: Any,
    *,
    names: tuple[str, str] = ("a", "b"),
    lookup: ResponseLookup | None = None,
) -> pd.DataFrame:
    """Two scorings (or generations) of the same tokens side by side, one row per token.

    Columns: ``token``, ``logprob_a`` / ``logprob_b`` and ``dlogprob`` (b - a), ``rank_a`` /
    ``rank_b``, ``argmax_agree`` (both put the same token first), and ``topk_kl``: KL(a || b)
    over the alternatives both returned, each renormalised over them (NaN without shared
    alternatives; ask for ``top_logprobs`` to get them). Raises ValueError, saying where,
    when the token sequences (their bytes) differ: rows are paired by position, so they must
    be the same tokens (scorings of one text with one tokenizer, or ``engine.score(response)``
    of a generated answer). Stored ids are read through ``lookup=`` as for
    :func:`logprobs_frame`.
    """
    fa, fb = logprobs_frame(a, lookup=lookup), logprobs_frame(b, lookup=lookup)
    _check_aligned(fa, fb, names)
    x, y = names
    out = pd.DataFrame(
        {
            "token": fa["token"].astype(str).to_numpy(),
            "text": fa["text"].to_numpy(),
            f"logprob_{x}": fa["logprob"].to_numpy(),
            f"logprob_{y}": fb["logprob"].to_numpy(),
        }
    )
    out["dlogprob"] = out[f"logprob_{y}"] - out[f"logprob_{x}"]
    out[f"rank_{x}"] = fa["rank"].to_numpy()
    out[f"rank_{y}"] = fb["rank"].to_numpy()
    ta, tb = _top_by_token(a, fa, lookup), _top_by_token(b, fb, lookup)
    out["argmax_agree"] = [
        bool(p) and bool(q) and max(p, key=lambda t: p[t]) == max(q, key=lambda t: q[t])
        for p, q in zip(ta, tb, strict=True)
    ]
    out["topk_kl"] = [_overlap_kl(p, q) for p, q in zip(ta, tb, strict=True)]
    return out


def _check_aligned(fa: pd.DataFrame, fb: pd.DataFrame, names: tuple[str, str]) -> None:
    """Refuse to pair rows of different token sequences (a silent mis-join otherwise)."""
    bytes_a, bytes_b = list(map(bytes, fa["bytes"])), list(map(bytes, fb["bytes"]))
    if bytes_a == bytes_b and len(fa) == len(fb):
        return
    where = next(
        (i for i, (x, y) in enumerate(zip(bytes_a, bytes_b, strict=False)) if x != y),
        min(len(fa), len(fb)),
    )

    def near(frame: pd.DataFrame) -> str:
        return repr([str(t) for t in frame["token"].iloc[max(0, where - 2) : where + 2]])

    raise ValueError(
        f"the two token sequences differ at token {where} ({names[0]}: {len(fa)} tokens, "
        f"{near(fa)}; {names[1]}: {len(fb)} tokens, {near(fb)}): compare scores the same "
        "tokens side by side. A generated answer re-encoded from its text can split "
        "differently: score the Response itself, engine.score(response), to get its own tokens"
    )


def _top_by_token(
    obj: Any, frame: pd.DataFrame, lookup: ResponseLookup | None
) -> list[dict[str, float]]:
    """Per token (in ``frame``'s order: ``obj``'s logprobs frame), its alternatives: token ->
    logprob."""
    top = top_logprobs_frame(obj, lookup=lookup)
    tops: list[dict[str, float]] = [{} for _ in range(len(frame))]
    if top.empty:
        return tops
    keys = ["response_id", "output_index", "content_index", "position"]
    order = {k: i for i, k in enumerate(frame[keys].itertuples(index=False))}
    for row in top.itertuples(index=False):
        index = order.get((row.response_id, row.output_index, row.content_index, row.position))
        if index is not None:
            tops[index][str(row.token)] = float(row.logprob)
    return tops


def _overlap_kl(p: dict[str, float], q: dict[str, float]) -> float:
    shared = [t for t in p if t in q]
    if not shared:
        return float("nan")
    lp = np.array([p[t] for t in shared])
    lq = np.array([q[t] for t in shared])
    lp = lp - np.logaddexp.reduce(lp)
    lq = lq - np.logaddexp.reduce(lq)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def compare(*args: Any, **options: Any) -> pd.DataFrame:
    """Deprecated name of :func:`compare_scorings` (``engine.divergence`` is the exact,
    full-vocabulary comparison of two engines)."""
    warnings.warn(
        "nbr.compare(a, b) is now nbr.compare_scorings(a, b)", DeprecationWarning, stacklevel=2
    )
    return compare_scorings(*args, **options)


def scorings_frame(scorings: list[Any], *, lookup: ResponseLookup | None = None) -> pd.DataFrame:
    """``logprobs_frame`` of many scorings, with a ``document`` column first: the index of
    each token's scoring in ``scorings`` (``engine.score_frame``)."""
    ids = {getattr(s, "id", None): i for i, s in enumerate(scorings)}
    frame = logprobs_frame(scorings, lookup=lookup)
    frame.insert(0, "document", frame["response_id"].astype(str).map(ids).astype("int64"))
    return frame
