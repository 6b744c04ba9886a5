"""Frames read stored responses by id through ``lookup=`` or the process's registry, and an id
found nowhere is the same KeyError however the frames were imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.frames import logprob, message, response

from nbresponses import frames
from nbresponses.traffic.lookup import stored

ROOT = Path(__file__).resolve().parents[2]

# the two ways a user reaches the frames, each run first in a fresh process
IMPORTS = {
    "package": "import nbresponses as nbr\nlogprobs_frame = nbr.logprobs_frame\n",
    "frames": "from nbresponses.frames import logprobs_frame\n",
}

MISSING = """
try:
    logprobs_frame("resp_missing")
except KeyError as exc:
    print("KeyError:", exc)
"""


@pytest.mark.parametrize("imported", sorted(IMPORTS))
def test_an_id_found_nowhere_is_a_key_error_however_frames_are_imported(imported: str) -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", IMPORTS[imported] + MISSING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("KeyError:"), out.stdout + out.stderr
    assert "resp_missing" in out.stdout
    assert os.environ["NBRESPONSES_STORE"] in out.stdout  # where it looked: the default file


class Held:
    """A lookup over given responses."""

    def __init__(self, *responses: Any) -> None:
        self.responses = {r.id: r for r in responses}

    def find(self, response_id: str) -> Any:
        return self.responses.get(response_id)

    def __repr__(self) -> str:
        return "<held in the test>"


def _answer(rid: str, *pieces: tuple[str, float]) -> Any:
    alternatives = [(" x", -4.0), (" y", -5.0)]
    return response(message([[logprob(t, v, alternatives) for t, v in pieces]]), rid=rid)


A = _answer("resp_a", ("Paris", -0.5), (" is", -1.0), (" big", -2.5))
B = _answer("resp_b", ("Rome", -0.25), (" too", -3.0))

# every frame function that reads Responses, called on an input with a lookup
READERS: dict[str, Callable[..., Any]] = {
    "logprobs_frame": frames.logprobs_frame,
    "top_logprobs_frame": frames.top_logprobs_frame,
    "usage_frame": frames.usage_frame,
    "events_frame": frames.events_frame,
    "samples_frame": frames.samples_frame,
    "sequence_logprob": frames.sequence_logprob,
    "perplexity": frames.perplexity,
    "classification_confidence": frames.classification_confidence,
    "words_frame": frames.words_frame,
    "span_surprisal": lambda obj, **kw: frames.span_surprisal(obj, 0, 3, **kw),
    "plot_logprobs": lambda obj, **kw: frames.plot_logprobs(obj, **kw).data,
    "compare_scorings": lambda obj, **kw: frames.compare_scorings(obj, obj, **kw),
    "option_likelihoods": lambda obj, **kw: frames.option_likelihoods(obj, ["p", "r"], **kw),
    "multiple_choice_frame": lambda obj, **kw: frames.multiple_choice_frame(
        [(obj, ["p", "r"], 0, None)], **kw
    ),
}


def _equal(got: Any, want: Any) -> None:
    if isinstance(want, pd.Series):
        pd.testing.assert_series_equal(got, want)
    else:
        pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_frame_reads_ids_through_the_lookup_it_is_given(name: str) -> None:
    read = READERS[name]
    _equal(read(["resp_a", "resp_b"], lookup=Held(A, B)), read([A, B]))


def test_an_id_a_list_and_a_history_frame_read_the_same_responses() -> None:
    held = Held(A, B)
    direct = frames.logprobs_frame([A, B])
    assert len(direct) == 5
    history = pd.DataFrame({"id": ["resp_a", "resp_b"], "status": ["completed"] * 2})
    _equal(frames.logprobs_frame(history, lookup=held), direct)
    _equal(frames.logprobs_frame(history["id"], lookup=held), direct)
    _equal(frames.logprobs_frame("resp_a", lookup=held), frames.logprobs_frame(A))


def test_the_registry_answers_when_no_lookup_is_given() -> None:
    held = Held(A)
    stored.register(held)
    try:
        _equal(frames.logprobs_frame("resp_a"), frames.logprobs_frame(A))
    finally:
        stored.unregister(held)
    with pytest.raises(KeyError, match="resp_a"):
        frames.logprobs_frame("resp_a")


def test_a_given_lookup_is_the_only_place_asked() -> None:
    held = Held(A)
    stored.register(held)
    try:
        with pytest.raises(KeyError, match=r"resp_a.*looked in <held in the test>\)"):
            frames.logprobs_frame("resp_a", lookup=Held(B))
    finally:
        stored.unregister(held)


def test_a_lookup_must_find() -> None:
    with pytest.raises(TypeError, match="find"):
        frames.logprobs_frame(A, lookup={"resp_a": A})
