"""Reading a field of an SDK object or of its JSON dict alike (``traffic/access.py``)."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseTextDeltaEvent

from nbresponses.traffic.access import field, getter, kind_of

DELTA = {
    "type": "response.output_text.delta",
    "item_id": "msg_1",
    "output_index": 0,
    "content_index": 0,
    "delta": "Hi",
    "logprobs": [],
    "sequence_number": 3,
}


def test_a_field_reads_the_same_from_an_object_and_its_dict():
    typed = ResponseTextDeltaEvent.model_validate(DELTA)
    for event in (DELTA, typed):
        assert field(event, "delta") == "Hi" and field(event, "sequence_number") == 3
        assert field(event, "obfuscation", "none") == "none"  # absent: the default
    assert field({"delta": None}, "delta", "") == ""  # None reads as the default too


def test_a_getter_reads_many_entries_at_once_and_fails_on_a_missing_name():
    typed = ResponseTextDeltaEvent.model_validate(DELTA)
    for event in (DELTA, typed):
        assert getter(event, "delta", "sequence_number")(event) == ("Hi", 3)
    with pytest.raises(KeyError):
        getter(DELTA, "nope")(DELTA)
    with pytest.raises(AttributeError):
        getter(typed, "nope")(typed)


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        ({"object": "response", "type": "response.completed"}, "response"),
        (DELTA, "event"),
        (ResponseTextDeltaEvent.model_validate(DELTA), "event"),
        ({"type": "error", "message": "boom"}, "event"),
        ({"type": "message"}, "unknown"),  # an output item, not traffic
        ({"type": 7}, "unknown"),
        ("response.completed", "unknown"),
    ],
)
def test_kind_of_tells_responses_events_and_the_rest(obj, kind):
    assert kind_of(obj) == kind
