"""Which scoring jobs run as the rows of one graph run.

Why: a run reads every weight once, whatever its rows, and a short text's run is mostly that
reading. Eight texts of 12 tokens scored one run each took 118 ms on the bundled model, as the
rows of one run 76 ms; four options of 5 tokens after a cached question 44 against 21 ms; the
same bits either way (``exact_steps`` graphs compute a token alike at every step shape;
benchmarks/README.md). The rows of a run are padded to its widest, so a group keeps padding
to a third of its positions at most, and long jobs run alone, in chunks, as before.

A job that shares its beginning with a job already in the group waits for the next group when
the prefix cache can hand it that beginning then (multiple choice: every option after the same
question), rather than computing it again beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from nbresponses.runtime.prefix_cache import common_length

MAX_FED = 128  # a job that computes more tokens runs alone, in chunks
MAX_ROWS = 16
MIN_SHARED = 8  # tokens a job must share with a member, beyond its cached ones, to wait


def next_group(
    jobs: Sequence[tuple[Sequence[int], int, int]],
    *,
    max_tokens: int,
    reuse: bool,
    max_fed: int = MAX_FED,
    max_rows: int = MAX_ROWS,
) -> list[int]:
    """The indices of the jobs for the next run, among ``jobs`` ((tokens, how many of them
    the prefix cache supplies now, how many it could: those before the first scored token's
    own) each, in the order they should run): the first, and each later one that fits beside
    those taken (rows x the widest row at most ``max_tokens``, padding at most a third of
    that). With ``reuse`` (a prefix cache that keeps what the run computes), a job that could
    take more than ``MIN_SHARED`` tokens it shares with a taken one from the cache waits."""
    if not jobs:
        return []
    tokens, cached, _ = jobs[0]
    widest = real = len(tokens) - cached
    chosen = [0]
    if widest > max_fed:
        return chosen
    for index in range(1, len(jobs)):
        if len(chosen) == max_rows:
            break
        tokens, cached, reusable = jobs[index]
        fed = len(tokens) - cached
        wide, rows = max(widest, fed), len(chosen) + 1
        if fed > max_fed or rows * wide > max_tokens or 2 * (rows * wide - real - fed) > real + fed:
            continue
        if reuse and any(
            min(common_length(tokens, jobs[j][0]), reusable) > cached + MIN_SHARED for j in chosen
        ):
            continue
        chosen.append(index)
        widest, real = wide, real + fed
    return chosen
