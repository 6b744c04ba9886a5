"""Budget-aware closing: a structured answer that the token budget would cut off ends complete.

A generation that may write ``budget`` more tokens under a grammar asks its constraint (when it
can say: ``ClosableConstraint``) for the shortest way to the grammar's end. Once that way is as
long as the tokens left (less ``CHECKED`` tokens of margin: one token can open an object with
many required keys), every choice is checked: the model's own token is kept while a way to the
end still fits after it, else the way's next token is taken instead, to the end token. The
answer that would have stopped mid-value ends as a parseable one, and when the closing replaced
a choice the generation reports finish "length" (the budget shaped its end, not the model).

The way is looked for rarely while the budget is far (every half of the slack), at every step
once it is near (``NEAR``), and for each choice once closing is due: about a millisecond each
time, a few dozen times per budget-bound answer. It depends only on the generation's own tokens,
so it is exact alone and batched. The engine (``runtime/constraints.py``) and the scripted
source both apply it, so a test on a script sees what a model would get.

A constraint whose output is worth nothing cut short (``whole``: a function call, whose
arguments must parse) is held strictly once its budget is within ``HORIZON`` tokens: a way to
the end that fits is kept at every step (each choice is checked, not only once the slack is
short, since one token can open a call), so the output always ends complete within the budget;
and when even the shortest way does not fit the budget before the first token (``hopeless``),
the source generates nothing and ends "length" (a response ``incomplete`` with no call, rather
than a call with broken arguments).
"""

from __future__ import annotations

from nbresponses.tokens.contract import ClosableConstraint, TokenConstraint

CLOSING_STEPS = 512  # the longest way to the end a closing walk looks for
NEAR = 32  # tokens of slack under which the way is looked for at every step
CHECKED = 16  # slack under which every choice is checked (one token can open a lot)
HORIZON = CLOSING_STEPS + 1  # a whole output's choices are checked from this many tokens left


class BudgetClosing:
    """One generation's closing state: when it is due, and which token it admits."""

    def __init__(self, constraint: TokenConstraint, budget: int | None) -> None:
        self._constraint = constraint if isinstance(constraint, ClosableConstraint) else None
        self.budget = budget
        self.accepted = 0
        self.due = False  # the way to the end fills what is left: every choice is checked
        self.way: list[int] = []  # the shortest way known from here, next token first
        self.closed_tokens = 0  # choices the closing replaced with its own token
        self._found: int | None = None  # length of the last way found
        self._next_look = 0  # ``accepted`` at which to look for the way again
        # a cut output is worth nothing (the constraint says so): held to a way that fits
        self.whole = self._constraint is not None and bool(getattr(constraint, "whole", False))
        self.hopeless = False  # whole, and the shortest way is longer than the whole budget

    @property
    def left(self) -> int:
        assert self.budget is not None
        return self.budget - self.accepted

    def check(self) -> None:
        """Before the next choice (on the mask thread): look for the way when it is time."""
        if self._constraint is None or self.budget is None:
            return
        if self.whole:
            self._check_whole()
            return
        if self.due:
            return
        left = self.left
        if self.accepted < self._next_look and left > (self._found or 0) + NEAR:
            return
        way = self._constraint.closing(CLOSING_STEPS)
        self._found = len(way) if way is not None else None
        slack = left - (self._found or 0)
        self._next_look = self.accepted + max(1, (slack - NEAR) // 2)
        if way is not None and len(way) > 1 and slack <= CHECKED:  # not at the end, room short
            self.due = True
            self.way = list(way)

    def _check_whole(self) -> None:
        """A whole output: hold a way that fits once the budget is within ``HORIZON``."""
        assert self._constraint is not None
        if self.way or self.left > HORIZON:
            return
        way = self._constraint.closing(CLOSING_STEPS)
        if way is None:  # not found: the choices stay unchecked until one is
            return
        if len(way) > self.left:  # the budget cannot hold it (from the start: nothing can)
            self.hopeless = self.accepted == 0
            return
        self.due, self.way = True, list(way)

    def admit(self, token: int) -> int:
        """The token to take after the choice ``token``: the choice itself while a way to the
        end still fits after it, else the way's next token."""
        if not self.due or not self.way or token == self.way[0]:
            return token
        assert self._constraint is not None
        if self.whole:
            after = self._constraint.closing(CLOSING_STEPS, after=token)
            # kept: a way fits after it, or the choice ends the output itself (its end token)
            if after is not None and (len(after) <= self.left - 1 or list(after) == [token]):
                self.way = [token, *after]
                return token
            self.closed_tokens += 1
            return self.way[0]
        after = self._constraint.closing(CLOSING_STEPS, after=token)
        # kept: a way fits after it, or the text may end right after it (free text, a number)
        if after is not None and (len(after) <= self.left - 1 or len(after) == 1):
            self.way = [token, *after]
            return token
        self.closed_tokens += 1
        return self.way[0]

    @property
    def forcing(self) -> int | None:
        """The token the closing would take next (None while it is not due)."""
        return self.way[0] if self.due and self.way else None

    def accept(self, token: int) -> None:
        self.accepted += 1
        if self.due:
            if self.way and self.way[0] == token:
                self.way = self.way[1:]
            else:  # never expected: a choice ``admit`` did not see
                self.due, self.way = False, []

    @property
    def closed_early(self) -> bool:
        """The closing replaced a choice of this generation (the budget shaped its end)."""
        return self.closed_tokens > 0
