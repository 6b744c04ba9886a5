"""Perplexity, classification confidence and the heat map on hand-computed cases."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers.frames import logprob, message, response

from nbresponses.frames import (
    classification_confidence,
    logprobs_frame,
    perplexity,
    plot_logprobs,
    sequence_logprob,
)
from nbresponses.frames._colors import VIRIDIS_ANCHORS, text_colors, viridis

L = math.log


def _two() -> list[object]:
    a = response(message([[logprob("a", L(0.5)), logprob("b", L(0.25))]]), rid="resp_a")
    b = response(message([[logprob("c", L(0.9))], [logprob("d", L(0.9))]]), rid="resp_b")
    return [a, b]


def test_sequence_logprob_and_perplexity_by_hand() -> None:
    seq = sequence_logprob(_two())
    assert seq.to_dict() == pytest.approx({"resp_a": L(0.125), "resp_b": 2 * L(0.9)})
    ppl = perplexity(_two())
    assert ppl.loc["resp_a", "n_tokens"] == 2
    assert ppl.loc["resp_a", "perplexity"] == pytest.approx(math.sqrt(8))
    assert ppl.loc["resp_b", "perplexity"] == pytest.approx(1 / 0.9)
    assert ppl.loc["resp_a", "mean_logprob"] == pytest.approx(L(0.125) / 2)
    pd.testing.assert_frame_equal(perplexity(logprobs_frame(_two())), ppl)


def _classifier(rid: str, chosen: str, alternatives: list[tuple[str, float]]) -> object:
    lp = dict(alternatives)[chosen]
    first = logprob(chosen, L(lp), [(t, L(p)) for t, p in alternatives])
    return response(message([[first, logprob(" trailing", -3.0)]]), rid=rid)


def test_classification_confidence_with_labels() -> None:
    r1 = _classifier("r1", "Pos", [("Pos", 0.6), (" positive", 0.2), ("Neg", 0.15), ("N", 0.05)])
    r2 = _classifier("r2", "neg", [("neg", 0.7), ("pos", 0.3)])
    out = classification_confidence([r1, r2], labels=["positive", "negative", "neutral"])
    assert out["label"].tolist() == ["positive", "negative"]
    assert out["confidence"].tolist() == pytest.approx([0.8, 0.7])
    # "N" is a prefix of both negative and neutral: it votes for neither
    assert out["p[negative]"].tolist() == pytest.approx([0.15, 0.7])
    assert out["p[neutral]"].tolist() == pytest.approx([0.0, 0.0])
    assert out["label_mass"].tolist() == pytest.approx([0.95, 1.0])
    assert out.index.tolist() == ["r1", "r2"]


def test_classification_confidence_without_labels() -> None:
    r = _classifier("r1", "Yes", [("Yes", 0.7), ("No", 0.2)])
    out = classification_confidence(r)
    assert out.loc["r1", "token"] == "Yes"
    assert out.loc["r1", "confidence"] == pytest.approx(0.7)
    assert out.loc["r1", "runner_up"] == "No"
    assert out.loc["r1", "margin"] == pytest.approx(L(0.7 / 0.2))


def test_classification_without_alternatives_uses_the_generated_token() -> None:
    r = response(message([[logprob("negative", L(0.9))]]), rid="r")
    out = classification_confidence(r, labels=["positive", "negative"])
    assert out.loc["r", "label"] == "negative"
    assert out.loc["r", "confidence"] == pytest.approx(0.9)


def test_viridis_hits_its_anchors_and_interpolates() -> None:
    assert viridis([0.0, 0.5, 1.0]) == [VIRIDIS_ANCHORS[0], VIRIDIS_ANCHORS[5], VIRIDIS_ANCHORS[10]]
    low, high = (int(VIRIDIS_ANCHORS[0][1:], 16), int(VIRIDIS_ANCHORS[1][1:], 16))
    quarter = int(viridis([0.025])[0][1:], 16)  # a quarter of the way from anchor 0 to 1
    for shift in (16, 8, 0):
        lo, hi, got = ((x >> shift) & 0xFF for x in (low, high, quarter))
        assert abs(got - (lo + (hi - lo) / 4)) <= 0.5
    assert viridis([-1.0, 2.0, float("nan")]) == ["#440154", "#fde725", "#440154"]
    assert text_colors([0.0, 1.0]) == ["#ffffff", "#000000"]


def test_heatmap_colours_tokens_by_probability_and_escapes_html() -> None:
    entries = [logprob("<b>", L(0.99)), logprob(" x", L(0.01))]
    r = response(message([entries]))
    html = plot_logprobs(r).to_html()
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert "␣x" in html
    probs = logprobs_frame(r)["prob"].tolist()
    for bg, fg in zip(viridis(probs), text_colors(probs), strict=True):
        assert f"background-color: {bg};\n  color: {fg};" in html
    assert text_colors(probs) == ["#000000", "#ffffff"]  # dark text on yellow, light on purple
    assert "matplotlib" not in html


def test_heatmap_caps_rows() -> None:
    entries = [logprob(str(i), -0.1) for i in range(10)]
    styler = plot_logprobs(response(message([entries])), max_rows=3)
    assert len(styler.data) == 3
