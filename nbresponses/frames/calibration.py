"""Calibration: does a probability of 0.8 come true 80% of the time?

For any probability column against 0/1 outcomes (a classifier's ``confidence`` against whether
it was right, ``choice_accuracy``'s ``p_sum`` against ``correct_sum``): a reliability table
per bin, the expected calibration error with its binning stated, and the Brier score.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["calibration_summary", "reliability_table"]


def _inputs(prob: Any, outcome: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(prob, dtype=np.float64).ravel()
    y = np.asarray(outcome, dtype=np.float64).ravel()
    if p.shape != y.shape:
        raise ValueError(f"{p.size} probabilities for {y.size} outcomes")
    if p.size == 0:
        raise ValueError("no probabilities")
    if np.isnan(p).any() or np.isnan(y).any():
        raise ValueError("missing probabilities or outcomes: drop them first")
    if (p < 0).any() or (p > 1).any():
        raise ValueError("probabilities must lie in [0, 1]")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("outcomes must be 0/1 or booleans")
    return p, y


def _edges(p: np.ndarray, bins: int, strategy: str) -> np.ndarray:
    if bins < 1:
        raise ValueError("bins must be >= 1")
    if strategy == "uniform":
        return np.linspace(0.0, 1.0, bins + 1)
    if strategy == "quantile":
        edges = np.quantile(p, np.linspace(0.0, 1.0, bins + 1))
        edges[0], edges[-1] = 0.0, 1.0
        return edges
    raise ValueError("strategy must be 'uniform' or 'quantile'")


def _bin_of(p: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin m holds (edges[m], edges[m+1]]; the first bin also holds its lower edge (p = 0)."""
    return np.clip(np.searchsorted(edges, p, side="left") - 1, 0, len(edges) - 2)


def reliability_table(
    prob: Any, outcome: Any, *, bins: int = 10, strategy: str = "uniform"
) -> pd.DataFrame:
    """One row per bin: ``lower``, ``upper`` (the bin holds probabilities in (lower, upper];
    the first also its lower edge), ``count``, ``confidence`` (mean probability in the bin),
    ``accuracy`` (fraction of outcomes that came true) and ``gap`` = accuracy − confidence
    (NaN for empty bins). ``strategy="uniform"``: ``bins`` equal widths over [0, 1];
    ``"quantile"``: edges at the probabilities' quantiles (about equal counts)."""
    p, y = _inputs(prob, outcome)
    edges = _edges(p, bins, strategy)
    which = _bin_of(p, edges)
    count = np.bincount(which, minlength=bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(which, weights=p, minlength=bins) / count
        accuracy = np.bincount(which, weights=y, minlength=bins) / count
    return pd.DataFrame(
        {
            "lower": edges[:-1],
            "upper": edges[1:],
            "count": count,
            "confidence": confidence,
            "accuracy": accuracy,
            "gap": accuracy - confidence,
        },
        index=pd.RangeIndex(bins, name="bin"),
    )


def calibration_summary(
    prob: Any, outcome: Any, *, bins: int = 10, strategy: str = "uniform"
) -> pd.Series:
    """``n``, ``ece`` (expected calibration error: ``Σ over bins of count/n · |accuracy −
    confidence|``, Guo et al. 2017, with the bins of :func:`reliability_table`), ``mce`` (the
    largest bin gap), ``brier`` (mean (p − outcome)²), ``accuracy`` and ``confidence`` (means),
    and the ``bins`` and ``strategy`` used: the ECE depends on them, so they travel with it."""
    p, y = _inputs(prob, outcome)
    table = reliability_table(p, y, bins=bins, strategy=strategy)
    filled = table[table["count"] > 0]
    gaps = (filled["accuracy"] - filled["confidence"]).abs()
    return pd.Series(
        {
            "n": int(p.size),
            "ece": float((filled["count"] / p.size * gaps).sum()),
            "mce": float(gaps.max()),
            "brier": float(np.mean((p - y) ** 2)),
            "accuracy": float(y.mean()),
            "confidence": float(p.mean()),
            "bins": bins,
            "strategy": strategy,
        },
        dtype=object,
    )
