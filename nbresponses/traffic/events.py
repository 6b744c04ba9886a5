"""The lifecycle event types of a Responses stream, and what each says of the response.

Every stream starts with ``response.created`` (background ones add ``response.queued``), then
``response.in_progress``, and ends with one terminal event. OpenAI ends a cancelled response
with no terminal event at all; ``response.cancelled`` is accepted all the same, because a
reader should not hang on traffic that sends one. vLLM ends a max-tokens stream with
``response.completed`` carrying status ``incomplete``: readers take the status from the
snapshot when it has one, from the event type otherwise.
"""

from __future__ import annotations

# Response.metadata key of nbresponses' scorings (``Engine.score``): "1" when every output token
# was given (teacher-forced) rather than generated. Frames show it as the ``given`` column.
GIVEN_METADATA = "nbresponses.given"

STARTED = ("response.created", "response.queued")  # the first snapshots of a response
IN_PROGRESS = "response.in_progress"
NON_TERMINAL = (*STARTED, IN_PROGRESS)
TERMINAL = {  # event type -> the status it ends the response with
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
    "response.cancelled": "cancelled",
}
LIFECYCLE = frozenset((*NON_TERMINAL, *TERMINAL))  # every event carrying a Response snapshot


def snapshot_rank(kind: str) -> int:
    """How final a lifecycle event's snapshot is: started 0, in progress 1, terminal 2, other
    events -1 (they carry no snapshot)."""
    if kind in TERMINAL:
        return 2
    if kind == IN_PROGRESS:
        return 1
    return 0 if kind in STARTED else -1
