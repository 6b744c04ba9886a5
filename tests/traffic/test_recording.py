"""Where the view hands a response it was asked to keep (``traffic/recording.py``): to every
registered recorder once, with a warning instead of a failure when none can take it."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from nbresponses.traffic import recording


@pytest.fixture
def recorders(monkeypatch):
    """The registry emptied for one test (the store may have registered itself on import, and
    the package registers its lazy fallback recorder)."""
    monkeypatch.setattr(recording, "_RECORDERS", [])
    monkeypatch.setattr(recording, "_FALLBACK", [])


def test_each_recorder_gets_the_response_once(recorders):
    got = []

    def keep(response, base_url, input):
        got.append((response, base_url, input))

    recording.register_recorder(keep)
    recording.register_recorder(keep)  # registered twice: called once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recording.keep_shown("r", "http://h/v1/responses")
        recording.keep_shown("s", None, "the question")
    assert got == [("r", "http://h/v1/responses", None), ("s", None, "the question")]


def test_without_a_recorder_or_with_a_failing_one_the_view_is_warned_not_broken(recorders):
    with pytest.warns(UserWarning, match=r"nbresponses\[engine\]"):
        recording.keep_shown("r", None)

    def broken(response, base_url, input):
        raise OSError("disk full")

    seen = []
    recording.register_recorder(broken)
    recording.register_recorder(lambda response, base_url, input: seen.append(response))
    with pytest.warns(UserWarning, match="not recorded: disk full"):
        recording.keep_shown("r", None)
    assert seen == ["r"]  # the failing recorder did not stop the next one


def test_the_origin_is_the_url_an_sdk_stream_was_read_from():
    request = SimpleNamespace(url="http://127.0.0.1:8000/v1/responses")
    stream = SimpleNamespace(response=SimpleNamespace(request=request))
    assert recording.origin_of(stream) == "http://127.0.0.1:8000/v1/responses"
    assert recording.origin_of(iter([])) is None  # our own streams and plain iterables
