"""Usage and engine timings summed over a response's rounds (built-in tool calls)."""

from __future__ import annotations

import time

from nbresponses.service.run import _add_stats, _timings
from nbresponses.tokens.contract import GenerationStats


def test_draft_counts_add_up_and_times_stay_the_first_rounds() -> None:
    total = GenerationStats()
    first = GenerationStats(
        prompt_tokens=40,
        cached_tokens=0,
        output_tokens=12,
        queued_s=0.01,
        prefill_s=0.05,
        draft_tokens=8,
        accepted_draft_tokens=6,
    )
    second = GenerationStats(
        prompt_tokens=70,
        cached_tokens=52,
        output_tokens=20,
        queued_s=0.02,
        prefill_s=0.03,
        draft_tokens=5,
        accepted_draft_tokens=1,
    )
    for one in (first, second):
        total = _add_stats(total, one, prompt_tokens=0)
    assert (total.prompt_tokens, total.cached_tokens, total.output_tokens) == (110, 52, 32)
    timings = _timings(total, time.perf_counter())
    assert timings.pop("wall_s") >= 0
    assert timings == {
        "queued_s": 0.01,
        "prefill_s": 0.05,
        "draft_tokens": 13,
        "accepted_draft_tokens": 7,
    }


def test_stored_timings_keep_their_keys_and_leave_out_what_was_not_measured() -> None:
    started = time.perf_counter()
    full = GenerationStats(
        queued_s=0.01,
        prefill_s=0.02,
        total_s=0.5,
        first_token_time=started + 0.03,
        draft_tokens=4,
        accepted_draft_tokens=0,
        closing_tokens=2,
        guarded_tokens=1,
    )
    timings = _timings(full, started)
    assert list(timings) == [
        "queued_s",
        "prefill_s",
        "draft_tokens",
        "accepted_draft_tokens",
        "closing_tokens",
        "guarded_tokens",
        "total_s",
        "first_token_s",
        "wall_s",
    ]
    assert timings["first_token_s"] == 0.03 and timings["accepted_draft_tokens"] == 0
    assert list(_timings(GenerationStats(), started)) == ["wall_s"]
