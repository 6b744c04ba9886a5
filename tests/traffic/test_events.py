"""The lifecycle of a Responses stream (``traffic/events.py``): which events start, carry and
end a response, and how final each one's snapshot is."""

from __future__ import annotations

from typing import get_args

import pytest
from openai.types.responses import ResponseStreamEvent

from nbresponses.traffic.events import LIFECYCLE, NON_TERMINAL, TERMINAL, snapshot_rank

# every event type the openai SDK knows: the members of its (annotated) union of stream events
SDK_TYPES = {
    get_args(member.model_fields["type"].annotation)[0]
    for member in get_args(get_args(ResponseStreamEvent)[0])
}


def test_the_lifecycle_types_are_the_sdks_and_each_status_is_one():
    assert SDK_TYPES | {"response.cancelled"} >= LIFECYCLE  # accepted, though OpenAI sends none
    assert set(TERMINAL.values()) == {"completed", "failed", "incomplete", "cancelled"}
    assert all(kind.removeprefix("response.") == status for kind, status in TERMINAL.items())
    assert not set(NON_TERMINAL) & set(TERMINAL)


@pytest.mark.parametrize(
    ("kind", "rank"),
    [
        ("response.created", 0),
        ("response.queued", 0),
        ("response.in_progress", 1),
        ("response.completed", 2),
        ("response.incomplete", 2),
        ("response.output_text.delta", -1),  # no snapshot at all
        ("error", -1),
    ],
)
def test_a_later_snapshot_ranks_higher(kind, rank):
    assert snapshot_rank(kind) == rank
