"""Grammar masks in the decode loop: one row's constraint, and the helper thread that fills them.

A constrained row's next-token mask depends only on the tokens it has accepted, so it can be
computed while the model computes the step's logits: ``MaskWorker.start`` hands the rows'
``fill_mask`` calls to one helper thread before the step (llguidance releases the GIL while it
walks the token trie), and the scheduler waits for them after it (``Pending.wait``).
``RowConstraint.masked`` then sets every disallowed token's logit to -inf for the choice only:
the reported logprobs are computed from the unmasked logits (the model's own distribution, before
the mask), so they are the same floats as for a free row and for ``engine.score`` of the output.
Budget-aware closing (``tokens/closing.py``) looks for the way to the grammar's end on the mask
thread; once that way fills the tokens left, ``admit`` checks each choice against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from nbresponses.tokens.closing import BudgetClosing
from nbresponses.tokens.contract import TokenConstraint


class RowConstraint:
    """A request's constraint with its mask buffer (one bit per token id) and its closing
    state (``budget``: the most tokens the row may still generate)."""

    def __init__(self, constraint: TokenConstraint, budget: int | None = None) -> None:
        self.constraint = constraint
        self.vocab_size = int(constraint.vocab_size)
        self.mask = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self.ready = False  # the mask is for the current state
        self.failure: BaseException | None = None
        self.closing = BudgetClosing(constraint, budget)

    def fill(self) -> None:
        try:
            self.constraint.fill_mask(self.mask)
            self.closing.check()
        except Exception as exc:  # reported by ``masked``, on the worker thread of the engine
            self.failure = exc
        self.ready = True

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

    def admit(self, token_id: int) -> int:
        """The token to take after choosing ``token_id`` (budget-aware closing may replace it)."""
        return self.closing.admit(token_id)

    def accept(self, token_id: int) -> None:
        self.constraint.accept(token_id)
        self.closing.accept(token_id)
        self.ready = False


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
