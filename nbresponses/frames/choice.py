"""Multiple choice: each option's score under the normalisations evaluation harnesses use.

Every score is a continuation's summed logprob, normalised one way (EleutherAI, L. Gao,
"Multiple Choice Normalization in LM Evaluation", 2021; lm-evaluation-harness,
``ConfigurableTask.process_results``):

- ``sum``: Σ logprob of the option's tokens: lm-eval's ``acc``;
- ``per_token``: the sum / the number of tokens (GPT-3's choice; depends on the tokenizer);
- ``per_char``: the sum / ``len(option)``, the option string's characters as given (lm-eval's
  ``acc_norm``: ``completion_len = len(choice)``);
- ``per_byte``: the sum / the UTF-8 bytes of the scored tokens (the blog post's byte-length
  normalisation, lm-eval's ``acc_bytes``);
- ``pmi``: the sum minus the option's summed logprob after a neutral context (lm-eval's
  ``acc_mutual_info``, whose neutral context is empty: the end-of-text token alone).

Each gives the option's rank among a question's options; ``prob_*`` is the softmax of that
score over the options (only ``prob``, from the sums, is the model's own probability
renormalised over the options; the others are for display and calibration).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from .logprobs import logprobs_frame

__all__ = ["NORMALISATIONS", "choice_accuracy", "multiple_choice_frame", "option_likelihoods"]

#: normalisation -> (score column, probability column) of :func:`option_likelihoods`
NORMALISATIONS: dict[str, tuple[str, str]] = {
    "sum": ("logprob", "prob"),
    "per_token": ("mean_logprob", "prob_mean"),
    "per_char": ("logprob_per_char", "prob_per_char"),
    "per_byte": ("logprob_per_byte", "prob_per_byte"),
    "pmi": ("pmi", "prob_pmi"),
}


def _softmax(values: np.ndarray) -> np.ndarray:
    weights = np.exp(values - np.nanmax(values))
    return weights / np.nansum(weights)


def _sum_and_bytes(scoring: Any, lookup: ResponseLookup | None) -> tuple[float, int, int]:
    frame = logprobs_frame(scoring, lookup=lookup)
    n_bytes = int(sum(len(b) for b in frame["bytes"]))
    return float(frame["logprob"].sum()), len(frame), n_bytes


def option_likelihoods(
    scorings: Sequence[Any],
    options: Sequence[str],
    *,
    unconditional: Sequence[Any] | None = None,
    lookup: ResponseLookup | None = None,
) -> pd.DataFrame:
    """One row per option (the index): ``tokens``, ``chars``, ``bytes``, the summed
    ``logprob`` and its normalisations ``mean_logprob`` (per token), ``logprob_per_char``,
    ``logprob_per_byte``; with ``unconditional`` (the options' scorings after a neutral
    context) also ``logprob_unconditional`` and ``pmi``; then ``prob``, ``prob_mean``,
    ``prob_per_char``, ``prob_per_byte`` (, ``prob_pmi``): the softmax of each score over the
    options. The definitions are the module's (lm-evaluation-harness's ``acc``, ``acc_norm``,
    ``acc_bytes``, ``acc_mutual_info``). ``scorings[i]`` scores ``options[i]`` after the
    question's prompt (a scoring may be a stored id, read through ``lookup=`` as for
    :func:`logprobs_frame`)."""
    if len(scorings) != len(options):
        raise ValueError(f"{len(scorings)} scorings for {len(options)} options")
    if unconditional is not None and len(unconditional) != len(options):
        raise ValueError(f"{len(unconditional)} unconditional scorings for {len(options)} options")
    rows = []
    for i, (option, scoring) in enumerate(zip(options, scorings, strict=True)):
        total, tokens, n_bytes = _sum_and_bytes(scoring, lookup)
        row: dict[str, Any] = {
            "option": option,
            "tokens": tokens,
            "chars": len(option),
            "bytes": n_bytes,
            "logprob": total,
            "mean_logprob": total / tokens if tokens else np.nan,
            "logprob_per_char": total / len(option) if option else np.nan,
            "logprob_per_byte": total / n_bytes if n_bytes else np.nan,
        }
        if unconditional is not None:
            alone = _sum_and_bytes(unconditional[i], lookup)[0]
            row["logprob_unconditional"] = alone
            row["pmi"] = total - alone
        rows.append(row)
    out = pd.DataFrame(rows).set_index("option")
    for score, prob in NORMALISATIONS.values():
        if score in out:
            out[prob] = _softmax(out[score].to_numpy(dtype=np.float64))
    return out


def multiple_choice_frame(
    questions: Sequence[tuple[Sequence[Any], Sequence[str], Any, Sequence[Any] | None]],
    *,
    lookup: ResponseLookup | None = None,
    labels: pd.Index | None = None,
) -> pd.DataFrame:
    """Many questions' :func:`option_likelihoods` in one long frame, indexed by
    ``(question, option_index)``, with the ``option`` text and ``correct`` (whether it is the
    answer; NA without one). ``questions``: per question ``(scorings, options, answer,
    unconditional scorings or None)``; ``answer`` is the correct option's text or index (None:
    unknown); ``lookup=`` as for :func:`option_likelihoods`. ``labels``: the questions' own
    index (``engine.choose_many``'s frame of questions), which then names the first level in
    place of their order."""
    if labels is not None and len(labels) != len(questions):
        raise ValueError(f"{len(labels)} labels for {len(questions)} questions")
    frames = []
    for q, (scorings, options, answer, unconditional) in enumerate(questions):
        one = option_likelihoods(
            scorings, options, unconditional=unconditional, lookup=lookup
        ).reset_index()
        gold = _answer_index(answer, options)
        one["correct"] = pd.array(
            [None if gold is None else i == gold for i in range(len(options))], dtype="boolean"
        )
        one.index = pd.MultiIndex.from_arrays(
            [np.full(len(one), q), np.arange(len(one))], names=["question", "option_index"]
        )
        frames.append(one)
    if not frames:
        raise ValueError("no questions")
    out = pd.concat(frames)
    if labels is not None:
        out.index = pd.MultiIndex.from_arrays(
            [labels.to_numpy()[out.index.get_level_values("question")],
             out.index.get_level_values("option_index")],
            names=[labels.name or "question", "option_index"],
        )  # fmt: skip
    return out


def _answer_index(answer: Any, options: Sequence[str]) -> int | None:
    if answer is None or (np.ndim(answer) == 0 and bool(pd.isna(answer))):
        return None  # None, NaN, pd.NA: unknown
    if isinstance(answer, str):
        if answer not in options:
            raise ValueError(f"answer {answer!r} is not among the options {list(options)}")
        return list(options).index(answer)
    index = int(answer)
    if not 0 <= index < len(options):
        raise ValueError(f"answer index {index} is out of range for {len(options)} options")
    return index


def choice_accuracy(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per question of a :func:`multiple_choice_frame`: for each normalisation ``k``
    present, ``pred_k`` (the chosen option's text; ties go to the first, as ``np.argmax``),
    ``p_k`` (its softmax probability over the options) and, where the answer is known,
    ``correct_k`` and ``brier_k`` (Σ over options of (p − 1[answer])², lm-eval's
    ``brier_score`` per question). ``frame.filter(like="correct_").mean()`` is the accuracy
    per normalisation (lm-eval's ``acc``, ``acc_norm``, ``acc_bytes``, ``acc_mutual_info``)."""
    rows = []
    key = frame.index.names[0] or "question"
    for q, one in frame.groupby(level=0, sort=False):
        gold = one["correct"].to_numpy(dtype=object)
        known = not any(g is pd.NA or g is None for g in gold)
        row: dict[str, Any] = {key: q, "options": len(one)}
        if known:
            row["answer"] = str(one["option"].to_numpy()[np.flatnonzero(gold.astype(bool))[0]])
        for name, (score, prob) in NORMALISATIONS.items():
            if score not in one:
                continue
            values = one[score].to_numpy(dtype=np.float64)
            if np.isnan(values).all():  # e.g. no unconditional scores for this question
                continue
            best = int(np.nanargmax(values))
            probs = one[prob].to_numpy(dtype=np.float64)
            row[f"pred_{name}"] = str(one["option"].to_numpy()[best])
            row[f"p_{name}"] = float(probs[best])
            if known:
                onehot = gold.astype(bool).astype(np.float64)
                row[f"correct_{name}"] = bool(onehot[best] == 1.0)
                row[f"brier_{name}"] = float(np.sum((probs - onehot) ** 2))
        rows.append(row)
    return pd.DataFrame(rows).set_index(key)
