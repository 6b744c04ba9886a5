"""What people compute from logprobs (cf. the OpenAI cookbook "Using logprobs").

Each function takes anything :func:`logprobs_frame` accepts, stored ids read through
``lookup=`` included (the perplexity functions also take that frame itself), and returns one
row per response, indexed by ``response_id`` (a stream without ids groups under NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from .logprobs import logprobs_frame, top_logprobs_frame

__all__ = ["classification_confidence", "perplexity", "sequence_logprob"]

_KEYS = ["response_id", "output_index", "content_index", "position"]


def _frame(obj: Any, lookup: ResponseLookup | None) -> pd.DataFrame:
    return obj if isinstance(obj, pd.DataFrame) else logprobs_frame(obj, lookup=lookup)


def _by_response(frame: pd.DataFrame) -> Any:
    return frame.groupby("response_id", observed=True, sort=False, dropna=False)


def sequence_logprob(obj: Any, *, lookup: ResponseLookup | None = None) -> pd.Series:
    """Sum of token logprobs per response: the log-probability of the whole generated text."""
    return _by_response(_frame(obj, lookup))["logprob"].sum().rename("sequence_logprob")


def perplexity(obj: Any, *, lookup: ResponseLookup | None = None) -> pd.DataFrame:
    """``n_tokens``, ``sequence_logprob``, ``mean_logprob`` and ``perplexity`` per response.

    ``perplexity = exp(-mean_logprob)``: 1 for a model certain of every token, growing as it
    hesitates. Comparable between responses of one model and tokenizer only.
    """
    grouped = _by_response(_frame(obj, lookup))["logprob"]
    out = pd.DataFrame({"n_tokens": grouped.size(), "sequence_logprob": grouped.sum()})
    out["mean_logprob"] = out["sequence_logprob"] / out["n_tokens"]
    out["perplexity"] = np.exp(-out["mean_logprob"])
    return out


def _normalise(text: str) -> str:
    return text.strip().casefold()


def _label_of(token: str, labels: Sequence[str]) -> str | None:
    """The label an alternative's token votes for: an exact match, else a unique prefix."""
    norm = _normalise(token)
    if not norm:
        return None
    exact = [label for label in labels if _normalise(label) == norm]
    if exact:
        return exact[0]
    prefixed = [label for label in labels if _normalise(label).startswith(norm)]
    return prefixed[0] if len(prefixed) == 1 else None


def _first_tokens(obj: Any, lookup: ResponseLookup | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first generated token of each response, and that token's alternatives."""
    if isinstance(obj, pd.DataFrame):
        raise TypeError("classification_confidence needs the Response(s), not a frame")
    frame = logprobs_frame(obj, lookup=lookup)
    first = frame.sort_values(_KEYS[1:], kind="stable").drop_duplicates("response_id")
    top = top_logprobs_frame(obj, lookup=lookup)
    alternatives = top.merge(first[_KEYS], on=_KEYS, how="inner")
    return first, alternatives


def classification_confidence(
    obj: Any, labels: Sequence[str] | None = None, *, lookup: ResponseLookup | None = None
) -> pd.DataFrame:
    """Confidence of a one-token answer, read from the first token's alternatives.

    Without ``labels``: the first token (``token``), its probability (``confidence``),
    ``runner_up`` and ``margin``. With ``labels``: each alternative votes for the label it
    spells (case and surrounding whitespace ignored; a token that is a prefix of exactly one
    label counts for it, so "Tech" counts for "Technology"); ``p[<label>]`` is the summed
    probability per label, ``label`` the likeliest, ``confidence`` its probability and
    ``label_mass`` the probability of any label (low when the model answered off-list). Ask
    for ``top_logprobs`` of about the number of labels or more.
    """
    first, alternatives = _first_tokens(obj, lookup)
    out = pd.DataFrame(
        {
            "token": first["text"].to_numpy(),
            "confidence": first["prob"].to_numpy(),
            "runner_up": first["runner_up"].to_numpy(),
            "margin": first["margin"].to_numpy(),
        },
        index=pd.Index(first["response_id"], name="response_id"),
    )
    if labels is None:
        return out
    labels = list(labels)
    votes = alternatives.assign(label=[_label_of(str(t), labels) for t in alternatives["token"]])
    # responses without alternatives still vote with the token they generated
    no_top = first[first["n_top"] == 0]
    votes = pd.concat(
        [votes, no_top.assign(label=[_label_of(t, labels) for t in no_top["text"]])],
        ignore_index=True,
    )
    mass = (
        votes.dropna(subset=["label"])
        .pivot_table(
            index="response_id",
            columns="label",
            values="prob",
            aggfunc="sum",
            observed=True,
            dropna=False,
        )
        .reindex(index=out.index, columns=labels)
        .fillna(0.0)
    )
    best = mass.to_numpy().argmax(axis=1) if labels else np.zeros(len(out), dtype=int)
    result = pd.DataFrame(index=out.index)
    result["label"] = pd.Categorical.from_codes(best, categories=labels) if labels else None
    result["confidence"] = mass.to_numpy()[np.arange(len(out)), best] if labels else np.nan
    result["label_mass"] = mass.sum(axis=1).to_numpy()
    for label in labels:
        result[f"p[{label}]"] = mass[label].to_numpy()
    return result
