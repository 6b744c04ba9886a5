"""Budget-aware closing: a structured answer that the token budget would cut off ends complete.

A generation that may write ``budget`` more tokens under a grammar asks its constraint (when it
can say: ``ClosableConstraint``) for the shortest way to the grammar's end. Once that way is as
long as the tokens left, only its next token is allowed, to the end token: the answer that would
have stopped mid-value ends as a parseable one, and the generation reports finish "length" (the
budget ended it, not the model). The way is looked for rarely while the budget is far (every
half of the slack), every step once it is near (``NEAR``), so it costs about a millisecond a
few times per answer. It depends only on the generation's own tokens: exact alone and batched.

The engine (``runtime/constraints.py``) and the scripted source both apply it, so a test on a
script sees what a model would get.
"""

from __future__ import annotations

import numpy as np

from nbresponses.tokens.contract import ClosableConstraint, TokenConstraint

CLOSING_STEPS = 512  # the longest way to the end a closing walk looks for
NEAR = 32  # tokens of slack under which the way is looked for at every step


class BudgetClosing:
    """One generation's closing state: when to force, and what."""

    def __init__(self, constraint: TokenConstraint, budget: int | None) -> None:
        self._constraint = constraint if isinstance(constraint, ClosableConstraint) else None
        self.budget = budget
        self.accepted = 0
        self.way: list[int] = []  # the way to the end being forced, next token first
        self.closed_tokens = 0  # tokens the closing forced
        self._found: int | None = None  # length of the last way found
        self._next_look = 0  # ``accepted`` at which to look for the way again

    @property
    def forcing(self) -> int | None:
        """The token the closing forces next (None: the generation chooses)."""
        return self.way[0] if self.way else None

    def narrow(self, mask: np.ndarray) -> None:
        """After the grammar filled ``mask``: allow only the way's next token when it is due."""
        if self._constraint is None or self.budget is None:
            return
        if not self.way:
            self._look()
        if self.way and not _only(mask, self.way[0]):
            self.way = []  # the grammar refuses the way (never expected): leave it free

    def _look(self) -> None:
        assert self._constraint is not None and self.budget is not None
        left = self.budget - self.accepted
        if self.accepted < self._next_look and left > (self._found or 0) + NEAR:
            return
        way = self._constraint.closing(CLOSING_STEPS)
        self._found = len(way) if way is not None else None
        slack = left - (self._found or 0)
        self._next_look = self.accepted + max(1, (slack - NEAR) // 2)
        if way is not None and 1 < len(way) >= left:  # not at the end, and no slack left
            self.way = list(way)

    def accept(self, token: int) -> None:
        self.accepted += 1
        if self.way:
            self.closed_tokens += 1
            self.way = self.way[1:] if self.way[0] == token else []

    @property
    def closed_early(self) -> bool:
        """The closing chose this generation's last tokens (the budget ended the answer)."""
        return self.closed_tokens > 0


def _only(mask: np.ndarray, token: int) -> bool:
    """Allow ``token`` alone in ``mask`` (one bit per id), if it was allowed at all."""
    word, bit = divmod(token, 32)
    view = mask.view(np.uint32)
    if not (int(view[word]) >> bit) & 1:
        return False
    view[:] = 0
    view[word] = np.uint32(1 << bit)
    return True
