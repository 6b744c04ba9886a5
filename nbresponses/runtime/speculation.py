"""Drafts for exact self-speculation, and how many of them a batched step should verify.

Prompt-lookup decoding: when the last ``n`` tokens of a request (prompt and answer so far)
occurred before, the tokens that followed them then are a cheap guess of what comes next. An
answer that quotes, summarises or edits its input repeats long runs of it; small models also
repeat their own phrases. The scheduler feeds the guesses together with the last token in one
step and keeps the ones the model chooses itself (``scheduler.Scheduler._verify``), so a draft
only ever changes the speed, never a token or a logprob.

A batched step feeds every row the same number of tokens (rows with shorter drafts are
padded), and its cost grows with rows x tokens. ``step_width`` picks the width that yields the
most expected tokens per unit of cost, from each row's draft and how often its drafts were kept.

Why our own code: the lookup is a dictionary of n-grams kept up to date token by token (a few
microseconds a step); the libraries that do prompt lookup (transformers'
``PromptLookupCandidateGenerator``, vLLM's n-gram proposer) are bound to their own engines and
tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NGRAMS = (3, 2)  # the longest match wins; one-token matches guess too poorly to pay
MAX_DRAFT = 8


@dataclass(frozen=True)
class StepCost:
    """What a step of B rows costs beyond its tokens, in tokens' worth of compute: ``step +
    row * B`` (a step of B rows x S tokens costs that plus B * S)."""

    step: float
    row: float


# Graphs whose attention is standard operators read every column of a row's KV buffers in a
# step, whatever its tokens: a cost per row. Fitted to the bundled model's fused-q8 graph on 2
# cores at 250 keys a row (``benchmarks/speculation.py``): 8.0 / 13.7 ms at 1 row x 1 / 9 tokens,
# 12.1 / 32.5 ms at 4 x 1 / 9, 26.1 / 37.2 / 67.2 / 111.7 ms at 16 x 1 / 2 / 5 / 9.
EVERY_COLUMN = StepCost(step=9.0, row=0.9)
# Our KVAttention reads a row's own columns only: a row costs its tokens and no more. Fitted to
# the bundled model's fused-int8-kernel graph the same way (6 December 2026): 6.6 / 7.6 / 10.3
# ms at 1 x 1 / 3 / 9, 17.4 / 29.1 / 65.7 / 105.7 ms at 16 x 1 / 2 / 5 / 9 (EVERY_COLUMN's 0.9 a
# row priced a 16 x 5 step at 2.6x a plain one, where it costs 3.8x, and widened steps that lost).
OWN_COLUMNS = StepCost(step=10.0, row=0.0)
# A wider step must beat the plain one by this factor: the cost model is rough, and a wrong
# guess costs the whole batch.
MIN_GAIN = 1.1
# How often a drafted token is kept, before a row has drafted: an optimistic guess, worth three
# tokens of evidence. A row is only ever judged by drafts it was allowed to try, so a cautious
# guess would keep a batch whose drafts would pay from ever trying them. Evidence (the guess
# included) decays by this factor per verified token, so a row that starts or stops repeating
# its input adapts within a few drafts.
PRIOR_KEPT, PRIOR_TRIED = 2.7, 3.0
DECAY = 0.85


class Drafter:
    """The n-gram index of one request's tokens and how often its drafts were kept."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the index after its latest end
        self._previous: dict[tuple[int, ...], int] = {}  # ...and the one before (self-match)
        self._kept, self._tried = PRIOR_KEPT, PRIOR_TRIED
        for token in prompt:
            self._add(int(token))
        self._prompt_length = len(prompt)

    def extend(self, generated: Sequence[int]) -> None:
        """Index the answer's tokens not indexed yet (callers pass the whole answer so far)."""
        for token in generated[len(self.tokens) - self._prompt_length :]:
            self._add(int(token))

    def _add(self, token: int) -> None:
        self.tokens.append(token)
        end = len(self.tokens)
        for n in NGRAMS:
            if end >= n:
                key = tuple(self.tokens[end - n : end])
                if key in self._last:
                    self._previous[key] = self._last[key]
                self._last[key] = end

    def propose(self, limit: int) -> list[int]:
        """Up to ``min(limit, MAX_DRAFT)`` tokens that followed the latest earlier occurrence
        of the longest matching suffix, or [] (no match, or no room)."""
        count = min(limit, MAX_DRAFT)
        if count <= 0:
            return []
        end = len(self.tokens)
        for n in NGRAMS:
            if end < n:
                continue
            key = tuple(self.tokens[end - n :])
            at = self._last.get(key)
            if at == end:  # the suffix itself: the occurrence before it
                at = self._previous.get(key)
            if at is not None and at < end:
                return self.tokens[at : at + count]
        return []

    @property
    def acceptance(self) -> float:
        """The chance that a drafted token is kept, given that the ones before it were."""
        return self._kept / self._tried

    def record(self, drafted: int, kept: int) -> None:
        """Learn from a verified draft: ``kept`` tokens were kept, then (if ``kept <
        drafted``) one was rejected; the tokens after a rejection tell nothing."""
        if not 0 <= kept <= drafted or drafted == 0:
            raise ValueError(f"kept {kept} of {drafted} drafted tokens")
        tried = kept + (kept < drafted)
        fade = DECAY**tried
        self._kept = self._kept * fade + kept
        self._tried = self._tried * fade + tried


def expected_kept(acceptance: float, count: int) -> float:
    """Expected kept tokens of a ``count``-token draft: draft i counts only if all before it
    were kept."""
    return sum(acceptance**i for i in range(1, count + 1))


def step_width(
    drafts: Sequence[tuple[int, float]],
    rows: int,
    *,
    cost: StepCost = EVERY_COLUMN,
    min_gain: float = MIN_GAIN,
) -> int:
    """Tokens per row for the next step of ``rows`` rows (1: a plain decode step), given the
    drafting rows' (draft length, acceptance). Each row yields its own next token plus the
    drafts it keeps; the step costs ``cost``'s overhead plus ``rows * width``."""
    if rows <= 0:
        return 1
    overhead = cost.step + cost.row * rows
    plain = rows / (overhead + rows)
    best, best_rate = 1, plain * min_gain
    longest = max((length for length, _ in drafts), default=0)
    for width in range(2, longest + 2):
        tokens = rows + sum(expected_kept(a, min(width - 1, n)) for n, a in drafts)
        rate = tokens / (overhead + rows * width)
        if rate > best_rate:
            best, best_rate = width, rate
    return best
