"""Words and spans: word sums against sums known by construction (the words are built first,
then cut into tokens), the boundary rules, user segmentations and slices."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.frames import logprob, message, response
from hypothesis import given, settings
from hypothesis import strategies as st

import nbresponses as nbr
from nbresponses.frames import logprobs_frame, span_surprisal, words_frame


def _tokens(pieces: list[tuple[bytes | str, float]], rid: str = "resp_1") -> object:
    return response(message([[logprob(t, v) for t, v in pieces]]), rid=rid)


def test_leading_space_tokens_count_for_the_word_after_them() -> None:
    pieces = [("The", -1.0), (" gar", -2.0), ("den", -0.5), (" path", -3.0), (".", -0.25)]
    out = words_frame(_tokens(pieces))
    assert out["text"].tolist() == ["The", "garden", "path."]
    assert out["logprob"].tolist() == [-1.0, -2.5, -3.25]
    assert out["surprisal"].tolist() == [1.0, 2.5, 3.25]
    np.testing.assert_allclose(out["surprisal_bits"], np.array([1.0, 2.5, 3.25]) / np.log(2))
    assert out["tokens"].tolist() == [1, 2, 2]
    assert out["first_position"].tolist() == [0, 1, 3]
    assert out["last_position"].tolist() == [0, 2, 4]
    assert out["char_start"].tolist() == [0, 4, 11] and out["char_end"].tolist() == [3, 10, 16]
    assert out["clean"].all()
    punct = words_frame(_tokens(pieces), boundary="punctuation")
    assert punct["text"].tolist() == ["The", "garden", "path", "."]
    assert punct["logprob"].tolist() == [-1.0, -2.5, -3.0, -0.25]


def test_a_token_across_a_boundary_counts_once_and_marks_both_words() -> None:
    pieces = [("dog", -1.0), (".\n", -2.0), ("\n", -0.5), ("Cat", -4.0), (" ", -0.125)]
    out = words_frame(_tokens(pieces), boundary="punctuation")
    assert out["text"].tolist() == ["dog", ".", "Cat"]
    # "\n" belongs to "Cat" (the next word); the trailing " " to the last word
    assert out["logprob"].tolist() == [-1.0, -2.0, -4.625]
    glued = [("dog.", -1.0), (" Cat", -2.0)]
    out = words_frame(_tokens(glued), boundary="punctuation")
    assert out["text"].tolist() == ["dog", ".", "Cat"]
    assert out["logprob"].tolist() == [-1.0, 0.0, -2.0] and out["tokens"].tolist() == [1, 0, 1]
    assert out["clean"].tolist() == [False, False, True]


def test_user_segmentation_for_text_without_spaces() -> None:
    # "我爱猫" in three tokens, the middle character split across two tokens' bytes
    ai = "爱".encode()
    pieces = [("我", -1.0), (ai[:2], -2.0), (ai[2:] + "猫".encode(), -3.0)]
    tokens = logprobs_frame(_tokens(pieces))
    assert tokens["text"].tolist() == ["我", "", "爱猫"]  # the frame's own convention
    out = words_frame(_tokens(pieces), words=["我", "爱", "猫"])
    assert out["text"].tolist() == ["我", "爱", "猫"]
    # the byte-split token counts for 爱 (the character it starts), the last for 爱 too
    assert out["logprob"].tolist() == [-1.0, -5.0, 0.0]
    assert out["clean"].tolist() == [True, False, False]
    with pytest.raises(ValueError, match="not found"):
        words_frame(_tokens(pieces), words=["我", "狗"])
    with pytest.raises(ValueError, match="segmentations for"):
        words_frame(_tokens(pieces), words=[["我"], ["爱"]])


def test_several_parts_and_responses_and_a_frame_input() -> None:
    a = _tokens([("a", -1.0), (" b", -2.0)], rid="resp_a")
    b = response(
        message([[logprob("x y", -3.0)], [logprob(" ", -1.0), logprob("z", -0.5)]]), rid="resp_b"
    )
    out = words_frame([a, b])
    assert out["response_id"].astype(str).tolist() == ["resp_a"] * 2 + ["resp_b"] * 3
    assert out["content_index"].tolist() == [0, 0, 0, 0, 1]
    assert out["logprob"].tolist() == [-1.0, -2.0, -3.0, 0.0, -1.5]
    pd.testing.assert_frame_equal(words_frame(logprobs_frame([a, b])), out)
    assert out.dtypes.astype(str).to_dict() == nbr.frames.WORDS_COLUMNS
    with pytest.warns(UserWarning):
        empty = words_frame(response(message([None])))
    assert empty.empty and list(empty.columns) == list(nbr.frames.WORDS_COLUMNS)


def test_spans_by_char_and_word() -> None:
    pieces = [("The", -1.0), (" old", -2.0), (" man", -4.0), (" the", -8.0), (" boat", -16.0)]
    s = _tokens(pieces)
    by_word = span_surprisal(s, 2, 4, unit="word")
    assert by_word["text"].tolist() == ["man the"]
    assert by_word["logprob"].tolist() == [-12.0] and by_word["tokens"].tolist() == [2]
    assert by_word[["first_position", "last_position"]].values.tolist() == [[2, 3]]
    # chars 4..7 are "old": its token " old" starts at char 3 (the space) and counts there
    assert span_surprisal(s, 4, 7)["logprob"].tolist() == [-2.0]
    assert span_surprisal(s, -4, None)["text"].tolist() == ["boat"]  # type: ignore[arg-type]
    assert span_surprisal(s, -1, None, unit="word")["logprob"].tolist() == [-16.0]  # type: ignore[arg-type]
    assert span_surprisal(s, 3, 3, unit="word")["tokens"].tolist() == [0]
    with pytest.raises(ValueError, match="unit"):
        span_surprisal(s, 0, 1, unit="token")


_WORD = st.text(alphabet="abcé猫!?,", min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(_WORD, min_size=1, max_size=8),
    data=st.data(),
)
def test_word_sums_equal_sums_known_by_construction(words: list[str], data: st.DataObject) -> None:
    """Build words, cut each (with its leading space) into byte pieces with random logprobs:
    each word's sum is known before any frame exists; the frame must give it back."""
    pieces: list[tuple[bytes, float]] = []
    expected = []
    for i, word in enumerate(words):
        raw = (" " if i else "").encode() + word.encode()
        cuts = sorted(
            data.draw(st.sets(st.integers(1, len(raw) - 1), max_size=3)) if len(raw) > 1 else []
        )
        bounds = [0, *cuts, len(raw)]
        values = [data.draw(st.floats(-20, 0, allow_nan=False, width=32)) for _ in bounds[1:]]
        pieces += [(raw[a:b], v) for a, b, v in zip(bounds[:-1], bounds[1:], values, strict=True)]
        expected.append(math.fsum(values))
    # words and tokens are of the whitespace rule, so every token lies inside one word
    out = words_frame(_tokens(pieces))  # type: ignore[arg-type]
    assert out["text"].tolist() == words
    np.testing.assert_allclose(out["logprob"], expected, rtol=0, atol=1e-9)
    total = math.fsum(v for _, v in pieces)
    assert math.isclose(out["logprob"].sum(), total, abs_tol=1e-9)
    whole = span_surprisal(_tokens(pieces), 0, len(words), unit="word")  # type: ignore[arg-type]
    assert math.isclose(whole["logprob"].iloc[0], total, abs_tol=1e-9)
    # any split of the words into two slices counts every token exactly once
    k = data.draw(st.integers(0, len(words)))
    left = span_surprisal(_tokens(pieces), 0, k, unit="word")  # type: ignore[arg-type]
    right = span_surprisal(_tokens(pieces), k, len(words), unit="word")  # type: ignore[arg-type]
    assert left["tokens"].iloc[0] + right["tokens"].iloc[0] == len(pieces)
    assert math.isclose(math.fsum(expected[:k]), left["logprob"].iloc[0], abs_tol=1e-9)


def _with_masses(pieces: list[tuple[str, float]], masses: list[float], after: float) -> object:
    from openai.types.responses.response_output_text import Logprob

    entries = []
    for (token, value), mass in zip(pieces, masses, strict=True):
        entry = {**logprob(token, value).model_dump(), "word_start_logmass": mass}
        entries.append(entry)
    entries[-1]["word_start_logmass_after"] = after
    return response(message([[Logprob.model_validate(e) for e in entries]]))


def test_bow_correction_by_hand() -> None:
    pieces = [("The", -1.0), (" gar", -2.0), ("den", -0.5), (" path", -3.0), ("\n", -0.25)]
    masses = [-9.0, -0.7, -5.0, -0.2, -0.1]  # log B at each token's position
    after = -0.05
    s = _with_masses(pieces, masses, after)
    out = words_frame(s, bow_correction=True)
    # The: no division (its token starts no whitespace), times B before " gar"
    # garden: / B at " gar", times B before " path"; path: / B at " path", times B after the end
    want_terms = [-0.7, -0.2 - (-0.7), after - (-0.2)]
    np.testing.assert_allclose(out["bow_correction"], want_terms, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        out["logprob"], np.array([-1.0, -2.5, -3.25]) + want_terms, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(out["surprisal_bits"], -out["logprob"] / np.log(2))
    # the corrections telescope: the first word divides by nothing, so they sum to log B(end)
    assert math.isclose(out["bow_correction"].sum(), after, abs_tol=1e-12)
    # a span is corrected as one word: log B after its end, over log B at its start
    span = span_surprisal(s, 1, 3, unit="word", bow_correction=True)
    assert span["logprob"].iloc[0] == pytest.approx(-2.5 - 3.25 + after - (-0.7), abs=1e-12)
    assert span["logprob"].iloc[0] == pytest.approx(out["logprob"].iloc[1:].sum(), abs=1e-12)
    first = span_surprisal(s, 0, 1, unit="word", bow_correction=True)
    assert first["logprob"].iloc[0] == pytest.approx(out["logprob"].iloc[0], abs=1e-12)
    with pytest.raises(ValueError, match="word_starts=True"):
        span_surprisal(_tokens(pieces), 0, 1, bow_correction=True)
    with pytest.raises(ValueError, match="word_starts=True"):
        words_frame(_tokens(pieces), bow_correction=True)
    with pytest.raises(ValueError, match="word_starts=True"):
        words_frame(logprobs_frame(s), bow_correction=True)
    with pytest.raises(ValueError, match="whitespace"):
        words_frame(s, bow_correction=True, boundary="punctuation")
