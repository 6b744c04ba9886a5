"""Multiple choice normalisations and calibration against hand computations in numpy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.frames import logprob, message, response

import nbresponses as nbr
from nbresponses.frames import (
    calibration_summary,
    choice_accuracy,
    multiple_choice_frame,
    option_likelihoods,
    reliability_table,
)


def _scoring(pieces: list[tuple[str, float]]) -> object:
    return response(message([[logprob(t, v) for t, v in pieces]]))


def _softmax(x: list[float]) -> np.ndarray:
    e = np.exp(np.array(x, dtype=np.float64))
    return e / e.sum()


OPTIONS = [" Paris", " Lyon-sur-Mer", " Nice é"]
PIECES = [
    [(" Paris", -0.5)],
    [(" Lyon", -1.0), ("-sur", -2.0), ("-Mer", -0.25)],
    [(" Nice", -0.75), (" é", -3.0)],
]
ALONE = [[(" Paris", -4.0)], [(" Lyon", -2.0), ("-sur", -1.0), ("-Mer", -0.5)], [(" Nice", -9.0)]]


def test_every_normalisation_by_hand() -> None:
    scorings = [_scoring(p) for p in PIECES]
    alone = [_scoring(p) for p in ALONE]
    out = option_likelihoods(scorings, OPTIONS, unconditional=alone)
    sums = [sum(v for _, v in p) for p in PIECES]
    tokens = [len(p) for p in PIECES]
    chars = [len(o) for o in OPTIONS]  # lm-eval: len(choice)
    nbytes = [sum(len(t.encode()) for t, _ in p) for p in PIECES]
    uncond = [sum(v for _, v in p) for p in ALONE]
    assert out.index.tolist() == OPTIONS
    assert out["tokens"].tolist() == tokens and out["chars"].tolist() == chars
    assert out["bytes"].tolist() == nbytes == [6, 13, 8]  # " é" is 3 bytes
    np.testing.assert_allclose(out["logprob"], sums)
    np.testing.assert_allclose(out["mean_logprob"], np.divide(sums, tokens))
    np.testing.assert_allclose(out["logprob_per_char"], np.divide(sums, chars))
    np.testing.assert_allclose(out["logprob_per_byte"], np.divide(sums, nbytes))
    np.testing.assert_allclose(out["logprob_unconditional"], uncond)
    np.testing.assert_allclose(out["pmi"], np.subtract(sums, uncond))
    np.testing.assert_allclose(out["prob"], _softmax(sums))
    np.testing.assert_allclose(out["prob_mean"], _softmax(list(np.divide(sums, tokens))))
    np.testing.assert_allclose(out["prob_per_char"], _softmax(list(np.divide(sums, chars))))
    np.testing.assert_allclose(out["prob_per_byte"], _softmax(list(np.divide(sums, nbytes))))
    np.testing.assert_allclose(out["prob_pmi"], _softmax(list(np.subtract(sums, uncond))))
    without = option_likelihoods(scorings, OPTIONS)
    assert "pmi" not in without and "prob_pmi" not in without
    with pytest.raises(ValueError, match="unconditional"):
        option_likelihoods(scorings, OPTIONS, unconditional=alone[:2])


def test_accuracy_and_brier_per_normalisation() -> None:
    # question 0: the sum prefers the short option, per-char normalisation the long one
    q0 = ([_scoring([(" a", -2.0)]), _scoring([(" abcdefghij", -3.0)])], [" a", " abcdefghij"])
    # question 1: the answer given by index; the neutral context flips PMI
    q1 = ([_scoring([(" x", -1.0)]), _scoring([(" y", -1.5)])], [" x", " y"])
    q1_alone = [_scoring([(" x", -0.5)]), _scoring([(" y", -3.0)])]
    frame = multiple_choice_frame(
        [(*q0, " abcdefghij", None), (*q1, 1, q1_alone), (*q1, pd.NA, q1_alone)]
    )
    assert frame.index.names == ["question", "option_index"]
    assert frame["correct"].tolist()[:4] == [False, True, False, True]
    assert frame["correct"].isna().tolist()[4:] == [True, True]
    acc = choice_accuracy(frame)
    assert acc.loc[0, "pred_sum"] == " a" and acc.loc[0, "pred_per_char"] == " abcdefghij"
    assert bool(acc.loc[0, "correct_per_char"]) and not bool(acc.loc[0, "correct_sum"])
    assert acc.loc[1, "pred_sum"] == " x" and acc.loc[1, "pred_pmi"] == " y"
    assert bool(acc.loc[1, "correct_pmi"]) and not bool(acc.loc[1, "correct_sum"])
    assert pd.isna(acc.loc[0, "pred_pmi"])  # question 0 has no unconditional scores
    p = _softmax([-2.0, -3.0])
    assert acc.loc[0, "p_sum"] == pytest.approx(p[0])
    assert acc.loc[0, "brier_sum"] == pytest.approx(p[0] ** 2 + (p[1] - 1) ** 2)
    assert pd.isna(acc.loc[2, "correct_sum"]) and acc.loc[2, "pred_pmi"] == " y"
    known = acc.dropna(subset=["correct_sum"])
    assert known["correct_sum"].astype(bool).mean() == 0.0
    assert known["correct_per_char"].astype(bool).mean() == 0.5
    with pytest.raises(ValueError, match="not among"):
        multiple_choice_frame([(*q0, "nope", None)])
    with pytest.raises(ValueError, match="out of range"):
        multiple_choice_frame([(*q0, 2, None)])


def _ece_by_loops(p: np.ndarray, y: np.ndarray, edges: np.ndarray) -> float:
    total = 0.0
    for m in range(len(edges) - 1):
        lo, hi = edges[m], edges[m + 1]
        inside = [(a, b) for a, b in zip(p, y, strict=True) if lo < a <= hi or (m == 0 and a == lo)]
        if inside:
            conf = sum(a for a, _ in inside) / len(inside)
            acc = sum(b for _, b in inside) / len(inside)
            total += len(inside) / len(p) * abs(acc - conf)
    return total


def test_calibration_on_known_inputs() -> None:
    summary = calibration_summary([0.2, 0.2, 0.8, 0.8], [0, 1, 1, 1], bins=2)
    assert summary["ece"] == pytest.approx(0.5 * 0.3 + 0.5 * 0.2)
    assert summary["brier"] == pytest.approx((0.04 + 0.64 + 0.04 + 0.04) / 4)
    assert summary["mce"] == pytest.approx(0.3) and summary["n"] == 4
    assert summary["bins"] == 2 and summary["strategy"] == "uniform"
    table = reliability_table([0.0, 0.1, 0.5, 1.0], [False, False, True, True], bins=2)
    assert table["count"].tolist() == [3, 1]  # 0 and 0.5 in the first bin (0, 0.5]
    assert table["accuracy"].tolist() == pytest.approx([1 / 3, 1.0])
    rng = np.random.default_rng(0)
    p = rng.uniform(size=500)
    y = (rng.uniform(size=500) < p**1.5).astype(float)
    got = calibration_summary(p, y, bins=10)
    assert got["ece"] == pytest.approx(_ece_by_loops(p, y, np.linspace(0, 1, 11)), abs=1e-12)
    assert got["brier"] == pytest.approx(np.mean((p - y) ** 2))
    q = reliability_table(p, y, bins=5, strategy="quantile")
    assert q["count"].tolist() == [100] * 5
    assert q["count"].sum() == 500 and math.isclose(q["upper"].iloc[-1], 1.0)
    assert nbr.calibration_summary is calibration_summary
    with pytest.raises(ValueError, match="0/1"):
        calibration_summary([0.5], [2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        calibration_summary([1.5], [1])
    empty = reliability_table([0.9], [1], bins=3)
    assert empty["confidence"].isna().tolist() == [True, True, False]
