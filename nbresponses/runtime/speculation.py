"""Drafts for exact self-speculation: the tokens that followed the last few tokens earlier on.

Prompt-lookup decoding: when the last ``n`` tokens of a request (prompt and answer so far)
occurred before, the tokens that followed them then are a cheap guess of what comes next. An
answer that quotes, summarises or edits its input repeats long runs of it; small models also
repeat their own phrases. The scheduler feeds the guesses together with the last token in one
step and keeps the ones the model chooses itself (``scheduler.Scheduler._speculate``), so a
draft only ever changes the speed, never a token or a logprob.

Why our own code: the lookup is a dictionary of n-grams kept up to date token by token (a few
microseconds a step); the libraries that do prompt lookup (transformers'
``PromptLookupCandidateGenerator``, vLLM's n-gram proposer) are bound to their own engines and
tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAMS = (3, 2)  # the longest match wins; one-token matches guess too poorly to pay
MAX_DRAFT = 8
START_DRAFT = 4
# A verify step costs about as much as a plain step plus a little per drafted token; when the
# drafts of the recent steps were mostly wrong, the row drafts nothing for a while.
COOLDOWN_STEPS = 16


class Drafter:
    """The n-gram index of one request's tokens and the length of its next draft."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the index after its latest end
        self._previous: dict[tuple[int, ...], int] = {}  # ...and the one before (self-match)
        self.size = START_DRAFT
        self._cooldown = 0
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
        """Up to ``min(limit, size)`` tokens that followed the latest earlier occurrence of the
        longest matching suffix, or [] (no match, cooling down, or no room)."""
        if self._cooldown > 0:
            self._cooldown -= 1
            return []
        count = min(limit, self.size)
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

    def record(self, drafted: int, kept: int) -> None:
        """Adapt the draft length to what the model kept."""
        if kept == drafted:
            self.size = min(MAX_DRAFT, self.size * 2)
        elif kept == 0:
            self.size = max(1, self.size // 2)
            if self.size == 1:
                self._cooldown = COOLDOWN_STEPS
                self.size = START_DRAFT
        else:
            self.size = max(1, kept + 1)
