"""compare pairs rows by position: it must refuse different token sequences, saying where."""

from __future__ import annotations

import pytest
from helpers.frames import logprob, message, response

from nbresponses.frames import compare_scorings as compare


def _scoring(pieces: list[tuple[str | bytes, float]]) -> object:
    return response(message([[logprob(t, v) for t, v in pieces]]))


def test_compare_refuses_another_split_of_the_same_text() -> None:
    generated = _scoring([("The", -1.0), (" Par", -2.0), ("is", -0.5), (".", -0.1)])
    re_encoded = _scoring([("The", -1.1), (" Paris", -2.2), (".", -0.2)])
    with pytest.raises(ValueError, match=r"differ at token 1 \(a: 4 tokens.*b: 3 tokens"):
        compare(generated, re_encoded)
    with pytest.raises(ValueError, match=r"engine\.score\(response\)"):
        compare(re_encoded, generated)


def test_compare_pairs_tokens_by_their_bytes() -> None:
    # tokens holding halves of a character: "é" (c3 a9) against "è" (c3 a8)
    e = "é".encode()
    split = _scoring([(e[:1], -1.0), (e[1:], -1.0)])
    other = _scoring([(e[:1], -1.0), ("è".encode()[1:], -1.0)])
    with pytest.raises(ValueError, match="differ at token 1"):
        compare(split, other)
    same = compare(split, _scoring([(e[:1], -0.5), (e[1:], -1.5)]))
    assert same["dlogprob"].tolist() == [0.5, -0.5]
