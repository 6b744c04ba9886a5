"""``samples_frame`` against a hand computation on small Responses (JSON dicts and objects)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbresponses.frames import SAMPLES_COLUMNS, samples_frame


def response(rid, seed, tokens, logprobs, processed=None) -> dict:
    entries = []
    for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=bool(logprobs))):
        entry = {"token": token, "bytes": list(token.encode()), "logprob": lp, "top_logprobs": []}
        if processed is not None:
            entry["processed_logprob"] = processed[i]
        entries.append(entry)
    part = {"type": "output_text", "text": "".join(tokens), "annotations": []}
    if logprobs:
        part["logprobs"] = entries
    return {
        "id": rid,
        "object": "response",
        "seed": seed,
        "output": [{"type": "message", "id": f"msg_{rid}", "role": "assistant",
                    "status": "completed", "content": [part]}],
    }  # fmt: skip


PARIS = (["Par", "is", "."], [-0.1, -0.2, -0.3], [-0.05, -0.1, -0.2])
PARIS_BANG = (["Par", "is", "!"], [-0.1, -0.2, -2.0], [-0.05, -0.1, -1.5])
LYON = (["Ly", "on", "."], [-2.0, -0.5, -0.3], [-1.8, -0.4, -0.2])
SAMPLES = [
    response("r1", 1, *PARIS),
    response("r2", 2, *PARIS),
    response("r3", 3, *PARIS_BANG),
    response("r4", 4, *LYON),
    response("r5", 5, *PARIS),
]


def _dtypes(frame):
    return {k: str(v) for k, v in frame.dtypes.items()}


def test_distinct_completions_by_hand():
    frame = samples_frame(SAMPLES)
    assert _dtypes(frame) == SAMPLES_COLUMNS
    assert frame["answer"].tolist() == ["Paris.", "Paris!", "Lyon."]
    assert frame["count"].tolist() == [3, 1, 1]
    assert frame["frequency"].tolist() == [0.6, 0.2, 0.2]
    assert frame["distinct"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(frame["sequence_logprob"], [-0.6, -2.3, -2.8], rtol=1e-12)
    np.testing.assert_allclose(
        frame["sequence_processed_logprob"], [-0.35, -1.65, -2.4], rtol=1e-12
    )
    # "Paris." and "Paris!" share "Par", "is"; "Lyon." shares nothing with either
    assert frame["diverges_at"].tolist() == [2, 2, 0]
    assert frame["seeds"].tolist() == [[1, 2, 5], [3], [4]]
    assert frame["response_ids"].tolist() == [["r1", "r2", "r5"], ["r3"], ["r4"]]
    assert frame.attrs["n"] == 5
    assert frame.attrs["entropy"] == pytest.approx(-(0.6 * math.log(0.6) + 0.4 * math.log(0.2)))
    assert frame.attrs["first_divergence"] == 0


def test_grouped_by_a_normalisation_by_hand():
    frame = samples_frame(SAMPLES, normalize=lambda text: text.rstrip(".!").lower())
    assert frame["answer"].tolist() == ["paris", "lyon"]
    assert frame["count"].tolist() == [4, 1] and frame["frequency"].tolist() == [0.8, 0.2]
    assert frame["distinct"].tolist() == [2, 1]
    assert frame["example"].tolist() == ["Paris.", "Lyon."]
    # a row of several texts: the log of the sum of their probabilities
    assert frame["sequence_logprob"].iloc[0] == pytest.approx(
        math.log(math.exp(-0.6) + math.exp(-2.3))
    )
    assert frame["sequence_processed_logprob"].iloc[0] == pytest.approx(
        math.log(math.exp(-0.35) + math.exp(-1.65))
    )
    assert frame["diverges_at"].tolist() == [0, 0]  # "paris" vs "lyon": at the first token
    assert frame["seeds"].tolist() == [[1, 2, 3, 5], [4]]
    assert frame.attrs["entropy"] == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))


def test_one_answer_and_a_shared_prefix():
    same = [response("a", 1, *PARIS), response("b", 2, *PARIS_BANG)]
    frame = samples_frame(same, normalize=lambda text: text[:5])
    assert frame["answer"].tolist() == ["Paris"] and frame["count"].tolist() == [2]
    assert frame["diverges_at"].isna().all()  # nothing else to part from
    assert frame.attrs["entropy"] == 0.0
    assert frame.attrs["first_divergence"] == 2


def test_without_logprobs_or_processed_ones():
    plain = [response("a", None, ["x"], []), response("b", None, ["y"], [])]
    frame = samples_frame(plain)
    assert frame["count"].tolist() == [1, 1] and frame["sequence_logprob"].isna().all()
    assert frame["diverges_at"].isna().all() and frame.attrs["first_divergence"] is None
    assert frame["seeds"].tolist() == [[None], [None]]
    raw_only = samples_frame([response("a", 1, *PARIS[:2])])
    assert raw_only["sequence_logprob"].iloc[0] == pytest.approx(-0.6)
    assert math.isnan(raw_only["sequence_processed_logprob"].iloc[0])


def test_typed_responses_read_like_dicts():
    from openai.types.responses import Response

    typed = [
        Response.model_validate(
            {**r, "created_at": 0, "model": "m", "parallel_tool_calls": True,
             "tool_choice": "auto", "tools": []}
        )
        for r in SAMPLES
    ]  # fmt: skip
    assert samples_frame(typed).equals(samples_frame(SAMPLES))


def test_empty():
    frame = samples_frame([])
    assert frame.empty and _dtypes(frame) == SAMPLES_COLUMNS and frame.attrs["n"] == 0
