"""Hypothesis properties of the logprob frames on generated Responses and their streams."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pandas as pd
from helpers.frames import logprob, message, response, stream, token_text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbresponses.frames import logprobs_frame, top_logprobs_frame

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12
)
logprobs = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@st.composite
def tokenized(draw: st.DrawFn) -> list[bytes]:
    """A text's UTF-8 bytes cut at arbitrary byte positions (so tokens may split characters)."""
    raw = draw(texts).encode()
    cuts = sorted(
        draw(st.sets(st.integers(1, len(raw) - 1), max_size=len(raw))) if len(raw) > 1 else []
    )
    bounds = [0, *cuts, len(raw)]
    return [raw[a:b] for a, b in pairwise(bounds)]


@st.composite
def parts(draw: st.DrawFn) -> list:
    entries = []
    for raw in draw(tokenized()):
        value = draw(logprobs)
        others = draw(st.lists(st.tuples(st.sampled_from("abcdefgh"), logprobs), max_size=4,
                               unique_by=lambda t: t[0]))  # fmt: skip
        alternatives = [(t, lp) for t, lp in others if t.encode() != raw]
        if draw(st.booleans()):
            alternatives.insert(draw(st.integers(0, len(alternatives))), (token_text(raw), value))
        entries.append(logprob(raw, value, alternatives))
    return entries


@st.composite
def responses(draw: st.DrawFn) -> object:
    n_parts = draw(st.integers(1, 3))
    return response(message([draw(parts()) for _ in range(n_parts)]))


@SETTINGS
@given(responses())
def test_prob_is_exp_logprob(r: object) -> None:
    frame = logprobs_frame(r)
    assert np.array_equal(frame["prob"].to_numpy(), np.exp(frame["logprob"].to_numpy()))
    top = top_logprobs_frame(r)
    assert np.array_equal(top["prob"].to_numpy(), np.exp(top["logprob"].to_numpy()))


@SETTINGS
@given(responses())
def test_text_and_offsets_rebuild_each_part(r: object) -> None:
    frame = logprobs_frame(r)
    for (_, ci), part in frame.groupby(["output_index", "content_index"]):
        text = r.output[0].content[ci].text
        assert "".join(part["text"]) == text
        for piece, offset in zip(part["text"], part["char_offset"], strict=True):
            assert text[offset : offset + len(piece)] == piece
        raw = b"".join(part["bytes"])
        assert raw.decode() == text
        sizes = part["bytes"].map(len).to_numpy()
        assert part["byte_offset"].tolist() == (np.cumsum(sizes) - sizes).tolist()


@SETTINGS
@given(responses(), st.integers(1, 4), st.booleans(), st.booleans(), st.booleans())
def test_stream_frame_equals_folded_response_frame(
    r: object, per_delta: int, done: bool, completed: bool, as_dicts: bool
) -> None:
    events = stream(r, per_delta=per_delta, done=done, completed=completed)
    if as_dicts:
        events = [e.model_dump(mode="json") for e in events]
    pd.testing.assert_frame_equal(logprobs_frame(events), logprobs_frame(r))
    pd.testing.assert_frame_equal(top_logprobs_frame(events), top_logprobs_frame(r))


@SETTINGS
@given(responses())
def test_statistics_agree_with_the_long_form(r: object) -> None:
    frame = logprobs_frame(r)
    top = top_logprobs_frame(r)
    keys = ["output_index", "content_index", "position"]
    chosen = top[top["chosen"]].set_index(keys)["rank"]
    ranks = frame.set_index(keys)["rank"].dropna().astype(int)
    assert ranks.sort_index().tolist() == chosen.sort_index().tolist()
    mass = top.groupby(keys)["prob"].sum()
    with_top = frame[frame["n_top"] > 0].set_index(keys)["topk_mass"]
    assert np.allclose(with_top.sort_index().to_numpy(), mass.sort_index().to_numpy())
    p = top["prob"].to_numpy()
    terms = pd.Series(np.where(p > 0, -p * top["logprob"].to_numpy(), 0.0), index=top.index)
    entropy = terms.groupby([top[k] for k in keys]).sum()
    assert np.allclose(
        frame[frame["n_top"] > 0].set_index(keys)["topk_entropy"].sort_index(), entropy.sort_index()
    )
    assert (frame["topk_entropy"].dropna() >= 0).all()
    margin_ok = frame["margin"].isna() | np.isclose(
        frame["margin"], frame["logprob"] - frame["runner_up_logprob"]
    )
    assert margin_ok.all()
    assert math.isfinite(frame["logprob"].sum())
