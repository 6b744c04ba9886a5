"""Plots of the analyses people would rather look at than read: surprisal along a text, a
reliability diagram, per-token divergence between two engines, option probabilities.

matplotlib is optional (the light install has no plotting library): each function imports it
when called and raises an ImportError naming it when it is missing. Each draws on ``ax`` (a
new figure's axes when None) and returns the Axes, so plots compose and tests can read them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from nbresponses.traffic.lookup import ResponseLookup

from .calibration import calibration_summary, reliability_table
from .choice import NORMALISATIONS
from .logprobs import logprobs_frame
from .words import Boundary, Segmentation, words_frame

__all__ = ["plot_divergence", "plot_options", "plot_reliability", "plot_surprisal"]


def _axes(ax: Any) -> Any:
    """``ax``, or the axes of a new figure; an ImportError naming matplotlib without it."""
    if ax is not None:
        return ax
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: pip install matplotlib"
        ) from exc
    _, new = plt.subplots(figsize=(8, 3))
    return new


def _visible(text: str) -> str:
    return text.replace("\n", "↵").replace(" ", "·") or "∅"


def plot_surprisal(
    obj: Any,
    *,
    unit: str = "token",
    bits: bool = False,
    boundary: Boundary = "whitespace",
    words: Segmentation = None,
    ax: Any = None,
    lookup: ResponseLookup | None = None,
) -> Any:
    """Surprisal along a text: one bar per token (``unit="token"``, whitespace made visible)
    or per word (``unit="word"``, as :func:`words_frame` with ``boundary`` / ``words``), in
    nats or ``bits``. Several parts or responses follow one another; stored ids are read
    through ``lookup=`` as for :func:`logprobs_frame`."""
    if unit == "token":
        frame = obj if isinstance(obj, pd.DataFrame) else logprobs_frame(obj, lookup=lookup)
        labels = [_visible(str(t)) for t in frame["text"]]
        values = -frame["logprob"].to_numpy(dtype=np.float64)
        if bits:
            values = values / np.log(2)
    elif unit == "word":
        frame = words_frame(obj, boundary=boundary, words=words, lookup=lookup)
        labels = [str(t) for t in frame["text"]]
        values = frame["surprisal_bits" if bits else "surprisal"].to_numpy(dtype=np.float64)
    else:
        raise ValueError("unit must be 'token' or 'word'")
    ax = _axes(ax)
    x = np.arange(len(values))
    ax.bar(x, values, color="#3b528b")
    ax.set_xticks(x, labels, rotation=90 if len(values) > 12 else 0, fontsize=8)
    ax.set_ylabel(f"surprisal ({'bits' if bits else 'nats'})")
    ax.set_xlabel(unit)
    ax.margins(x=0.01)
    return ax


def plot_reliability(
    prob: Any,
    outcome: Any,
    *,
    bins: int = 10,
    strategy: str = "uniform",
    ax: Any = None,
) -> Any:
    """A reliability diagram: the fraction of outcomes that came true against the mean
    probability per bin (:func:`reliability_table`), the diagonal of perfect calibration, and
    the ECE and Brier score (:func:`calibration_summary`) in the title."""
    table = reliability_table(prob, outcome, bins=bins, strategy=strategy)
    summary = calibration_summary(prob, outcome, bins=bins, strategy=strategy)
    filled = table[table["count"] > 0]
    ax = _axes(ax)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="calibrated")
    ax.bar(
        (filled["lower"] + filled["upper"]) / 2,
        filled["accuracy"],
        width=(filled["upper"] - filled["lower"]) * 0.9,
        color="#21918c",
        alpha=0.8,
        label="observed",
    )
    ax.plot(filled["confidence"], filled["accuracy"], "o", color="#440154", label="bin means")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted probability")
    ax.set_ylabel("fraction true")
    ax.set_title(
        f"ECE {summary['ece']:.3f} ({bins} {strategy} bins), Brier {summary['brier']:.3f}, "
        f"n={summary['n']}"
    )
    ax.legend(loc="upper left", fontsize=8)
    return ax


def plot_divergence(comparison: pd.DataFrame, *, column: str | None = None, ax: Any = None) -> Any:
    """Per-token divergence between two engines along the text, from :func:`compare` (its
    ``topk_kl``) or a full-vocabulary comparison (its ``kl``): one bar per token, tokens where
    the two disagree on the top-1 in red."""
    if column is None:
        column = "kl" if "kl" in comparison else "topk_kl"
    if column not in comparison:
        raise ValueError(f"the comparison has no column {column!r}")
    values = comparison[column].to_numpy(dtype=np.float64)
    agree = (
        comparison["argmax_agree"].to_numpy(dtype=bool)
        if "argmax_agree" in comparison
        else np.ones(len(values), bool)
    )
    ax = _axes(ax)
    x = np.arange(len(values))
    ax.bar(x, np.nan_to_num(values), color=np.where(agree, "#3b528b", "#d62728"))
    labels = [_visible(str(t)) for t in comparison.get("text", comparison.get("token", x))]
    ax.set_xticks(x, labels, rotation=90 if len(values) > 12 else 0, fontsize=8)
    ax.set_ylabel(f"{column} (nats)")
    ax.set_xlabel("token (red: the top-1 differs)")
    ax.margins(x=0.01)
    return ax


def plot_options(frame: pd.DataFrame, *, normalisation: str = "sum", ax: Any = None) -> Any:
    """The probability of each option under one normalisation (:data:`NORMALISATIONS`), from
    ``engine.choose`` / :func:`option_likelihoods`: horizontal bars, the likeliest darkest."""
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {sorted(NORMALISATIONS)}")
    column = NORMALISATIONS[normalisation][1]
    if column not in frame:
        raise ValueError(f"the frame has no {column!r} (PMI needs unconditional=...)")
    probs = frame[column].to_numpy(dtype=np.float64)
    labels = [_visible(str(o)) for o in frame.index]
    ax = _axes(ax)
    y = np.arange(len(probs))
    best = int(np.nanargmax(probs))
    ax.barh(y, probs, color=["#440154" if i == best else "#5ec962" for i in y])
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"probability among the options ({normalisation})")
    return ax
