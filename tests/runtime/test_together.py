"""Which scoring jobs share a run (``together.next_group``): the rules, one at a time. That
the rows of a run get the numbers each job gets alone is tested on real graphs
(tests/analysis/test_scoring.py, tests/runtime/test_determinism_bundled.py)."""

from __future__ import annotations

from nbresponses.runtime.together import MAX_FED, MAX_ROWS, MIN_SHARED, next_group


def jobs(*shapes: tuple[int, int]) -> list[tuple[tuple[int, ...], int, int]]:
    """(tokens, cached, reusable) per (length, cached) shape: each job's tokens its own (no
    shared start), every token but the last one reusable."""
    return [
        (tuple(range(1000 * (i + 1), 1000 * (i + 1) + length)), cached, length - 1)
        for i, (length, cached) in enumerate(shapes)
    ]


def test_short_jobs_share_a_run_up_to_its_positions():
    # 12 uncached tokens each: 21 rows x 12 = 252 positions fit 256, but 16 rows is the most
    assert next_group(jobs(*[(12, 0)] * 30), max_tokens=256, reuse=False) == list(range(MAX_ROWS))
    # 40 tokens each: 6 x 40 = 240 fit, a seventh would make 280
    assert next_group(jobs(*[(40, 0)] * 10), max_tokens=256, reuse=False) == list(range(6))
    # what the cache supplies is not computed: 100 tokens, 90 cached, is a 10-token row
    assert next_group(jobs((100, 90), (100, 95), (12, 0)), max_tokens=32, reuse=False) == [0, 1]


def test_a_long_job_runs_alone_and_is_not_taken_beside_others():
    assert next_group(jobs((MAX_FED + 1, 0), (10, 0)), max_tokens=4096, reuse=False) == [0]
    assert next_group(jobs((10, 0), (MAX_FED + 1, 0), (12, 0)), max_tokens=4096, reuse=False) == [
        0,
        2,
    ]
    assert next_group([], max_tokens=256, reuse=False) == []


def test_padding_stays_under_a_third_of_the_run():
    # 10 and 30: 2 x 30 = 60 positions for 40 tokens, a third padding: taken; 10 and 31: not
    assert next_group(jobs((10, 0), (30, 0)), max_tokens=256, reuse=False) == [0, 1]
    assert next_group(jobs((10, 0), (31, 0)), max_tokens=256, reuse=False) == [0]
    # a job that does not fit is passed over, a later one that fits is still taken
    assert next_group(jobs((10, 0), (31, 0), (12, 0)), max_tokens=256, reuse=False) == [0, 2]


def test_a_job_waits_for_the_beginning_it_shares_when_the_cache_will_hold_it():
    question = tuple(range(1000, 1040))
    # options scored after the question: it is what the cache may supply; nothing cached yet
    options = [((*question, 7, 8, i), 0, len(question)) for i in range(4)]
    # with a prefix cache, the others wait: the next group finds the question cached
    assert next_group(options, max_tokens=256, reuse=True) == [0]
    # without one, waiting saves nothing: all four run together
    assert next_group(options, max_tokens=256, reuse=False) == [0, 1, 2, 3]
    # once cached, the beginning they share is not recomputed: together
    cached = [(tokens, len(question), len(question)) for tokens, _, _ in options]
    assert next_group(cached, max_tokens=256, reuse=True) == [0, 1, 2, 3]
    # texts scored from their first token need every position's logits: the cache can supply
    # none of what they share, so they do not wait
    whole = [(tokens, 0, 0) for tokens, _, _ in options]
    assert next_group(whole, max_tokens=256, reuse=True) == [0, 1, 2, 3]
    # a few shared tokens (a chat template's opening) are not worth a run of their own
    near = [(tuple(range(MIN_SHARED)) + (50 + i,) * 20, 0, 27) for i in range(3)]
    assert next_group(near, max_tokens=256, reuse=True) == [0, 1, 2]
