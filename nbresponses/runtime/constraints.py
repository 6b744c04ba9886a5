"""Grammar masks in the decode loop: one row's constraint, and the helper thread that fills them.

A constrained row's next-token mask depends only on the tokens it has accepted, so it can be
computed while the model computes the step's logits: ``MaskWorker.start`` hands the rows'
``fill_mask`` calls to one helper thread before the step (llguidance releases the GIL while it
walks the token trie), and the scheduler waits for them after it (``Pending.wait``).
``RowConstraint.masked`` then sets every disallowed token's logit to -inf for the choice only:
the reported logprobs are computed from the unmasked logits (the model's own distribution, before
the mask), so they are the same floats as for a free row and for ``engine.score`` of the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from nbresponses.tokens.contract import ClosableConstraint, TokenConstraint

CLOSING_STEPS = 512  # the longest way to the end a closing walk looks for
NEAR = 32  # tokens of slack under which the way is recomputed every step


class RowConstraint:
    """A request's constraint with its mask buffer (one bit per token id), and the closing
    state when the row has a ``budget`` (the most tokens it may still generate)."""

    def __init__(self, constraint: TokenConstraint, budget: int | None = None) -> None:
        self.constraint = constraint
        self.vocab_size = int(constraint.vocab_size)
        self.mask = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self.ready = False  # the mask is for the current state
        self.failure: BaseException | None = None
        self.budget = budget if isinstance(constraint, ClosableConstraint) else None
        self.accepted = 0
        self.closing: list[int] = []  # the way to the end being forced, next token first
        self.closed_tokens = 0  # tokens the closing forced
        self._way: int | None = None  # length of the last way found
        self._next_check = 0  # ``accepted`` at which to look for the way again

    def fill(self) -> None:
        try:
            self.constraint.fill_mask(self.mask)
            self._close_if_due()
        except Exception as exc:  # reported by ``masked``, on the worker thread of the engine
            self.failure = exc
        self.ready = True

    def _close_if_due(self) -> None:
        if self.budget is None:
            return
        if self.closing:
            self._only(self.closing[0])
            return
        left = self.budget - self.accepted
        if self.accepted < self._next_check and left > (self._way or 0) + NEAR:
            return
        assert isinstance(self.constraint, ClosableConstraint)
        way = self.constraint.closing(CLOSING_STEPS)
        self._way = len(way) if way is not None else None
        slack = left - (self._way or 0)
        self._next_check = self.accepted + max(1, (slack - NEAR) // 2)
        due = way is not None and 1 < len(way) >= left  # not at the end, and no slack left
        if due and way is not None and self._only(way[0]):
            self.closing = list(way)

    def _only(self, token: int) -> bool:
        """Allow ``token`` alone (if the grammar allows it at all)."""
        word, bit = divmod(token, 32)
        view = self.mask.view(np.uint32)
        if not (int(view[word]) >> bit) & 1:
            self.closing = []
            return False
        view[:] = 0
        view[word] = np.uint32(1 << bit)
        return True

    def allowed(self, width: int) -> np.ndarray:
        """A bool per logit column: may that token come next."""
        if not self.ready:
            self.fill()
        if self.failure is not None:
            raise RuntimeError(f"the grammar failed: {self.failure}")
        bits = np.unpackbits(self.mask.view(np.uint8), bitorder="little")
        allowed = np.zeros(width, dtype=bool)
        n = min(width, self.vocab_size)
        allowed[:n] = bits[:n]
        if not allowed.any():
            why = self.constraint.error or "no token is allowed"
            raise RuntimeError(f"the grammar allows no next token: {why}")
        return allowed

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every disallowed token at -inf (for choosing, not for logprobs)."""
        return np.where(self.allowed(logits.shape[-1]), logits, np.float32(-np.inf))

    def accept(self, token_id: int) -> None:
        self.constraint.accept(token_id)
        self.ready = False
        self.accepted += 1
        if self.closing:
            self.closed_tokens += 1
            self.closing = self.closing[1:] if self.closing[0] == token_id else []

    @property
    def closed_early(self) -> bool:
        """The closing chose this row's last tokens (the budget ended the answer)."""
        return self.closed_tokens > 0


class Pending:
    """Masks being filled; ``wait`` returns once they all are."""

    def __init__(self, future: Future[None] | None) -> None:
        self._future = future

    def wait(self) -> None:
        if self._future is not None:
            self._future.result()
            self._future = None


class MaskWorker:
    """One helper thread that fills the masks of a step's constrained rows."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, rows: Sequence[Any]) -> Pending:
        todo = [r.constraint for r in rows if r.constraint is not None and not r.constraint.ready]
        if not todo:
            return Pending(None)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="nbresponses-masks")
        return Pending(self._pool.submit(_fill_all, todo))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _fill_all(constraints: Sequence[RowConstraint]) -> None:
    for c in constraints:
        c.fill()
