"""The plots draw the numbers of the analyses (read back from the Axes) and say what they need."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from helpers.frames import logprob, message, response

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import nbresponses as nbr  # noqa: E402
from nbresponses.frames import compare_scorings, option_likelihoods  # noqa: E402

PIECES = [("The", -1.0), (" gar", -2.0), ("den", -0.5), (" path", -3.0)]


def _scoring(pieces: list[tuple[str, float]]) -> object:
    return response(message([[logprob(t, v) for t, v in pieces]]))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _heights(ax) -> list[float]:
    return [p.get_height() for p in ax.patches]


def test_surprisal_by_token_and_word() -> None:
    ax = nbr.plot_surprisal(_scoring(PIECES))
    assert _heights(ax) == [1.0, 2.0, 0.5, 3.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "·gar", "den", "·path"]
    words = nbr.plot_surprisal(_scoring(PIECES), unit="word", bits=True)
    np.testing.assert_allclose(_heights(words), np.array([1.0, 2.5, 3.0]) / math.log(2))
    assert "bits" in words.get_ylabel()
    with pytest.raises(ValueError, match="unit"):
        nbr.plot_surprisal(_scoring(PIECES), unit="char")


def test_reliability_diagram() -> None:
    p, y = [0.2, 0.2, 0.8, 0.8], [0, 1, 1, 1]
    _fig, given = plt.subplots()
    ax = nbr.plot_reliability(p, y, bins=2, ax=given)
    assert ax is given
    assert _heights(ax) == pytest.approx([0.5, 1.0])  # fraction true per bin, by hand
    assert "ECE 0.250" in ax.get_title() and "Brier 0.190" in ax.get_title()


def test_divergence_and_options() -> None:
    a = _scoring(
        [
            (
                "x",
                -1.0,
            ),
            ("y", -2.0),
        ]
    )
    b = _scoring([("x", -1.5), ("y", -2.0)])
    comparison = compare_scorings(a, b)
    comparison["kl"] = [0.25, 0.0]
    ax = nbr.plot_divergence(comparison)
    assert _heights(ax) == [0.25, 0.0] and ax.get_ylabel().startswith("kl")
    options = option_likelihoods([_scoring([(" a", -1.0)]), _scoring([(" b", -2.0)])], [" a", " b"])
    bars = nbr.plot_options(options)
    widths = [p.get_width() for p in bars.patches]
    np.testing.assert_allclose(widths, [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])
    with pytest.raises(ValueError, match="unconditional"):
        nbr.plot_options(options, normalisation="pmi")


def test_without_matplotlib_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="matplotlib"):
        nbr.plot_surprisal(_scoring(PIECES))
