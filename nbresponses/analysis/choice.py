"""Multiple choice on the engine: score each option after its question (and, for PMI, after a
neutral context), batched, into the frames of ``nbresponses.frames.choice``.

The options of one question are submitted together: on this kernel's engine the first computes
the question, and the others then take it from the prefix cache and run as the rows of one
graph run (``runtime/together.py``); several questions run ``concurrency`` at a time.
The unconditional scorings depend on the option text alone: each distinct option is scored
after the neutral context once. Any backend will do (``ScoringBackend``): this kernel's, or a
server's (``nbr.RemoteEngine``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nbresponses.frames.choice import multiple_choice_frame, option_likelihoods
from nbresponses.service.scoring import DEFAULT_METHOD, Method

from .backend import ScoringBackend

__all__ = ["choose", "choose_many"]


class _Unconditional:
    """Scorings of options after the neutral context, each distinct option once."""

    def __init__(
        self, backend: ScoringBackend, context: str, chat: bool | None, method: Method
    ) -> None:
        self.backend, self.context, self.chat, self.method = backend, context, chat, method
        self._tasks: dict[str, asyncio.Future[Any]] = {}

    async def of(self, options: Sequence[str]) -> list[Any]:
        for option in options:
            if option not in self._tasks:
                self._tasks[option] = asyncio.ensure_future(
                    self.backend.score_text(
                        self.context, option, chat=self.chat, method=self.method
                    )
                )
        return list(await asyncio.gather(*(self._tasks[o] for o in options)))


def _neutral(
    backend: ScoringBackend, context: str | None, chat: bool | None, method: Method
) -> _Unconditional | None:
    return None if context is None else _Unconditional(backend, context, chat, method)


async def _score_question(
    backend: ScoringBackend,
    prompt: Any,
    options: Sequence[str],
    chat: bool | None,
    method: Method,
    unconditional: _Unconditional | None,
) -> tuple[list[Any], list[Any] | None]:
    conditional = asyncio.gather(
        *(backend.score_text(prompt, option, chat=chat, method=method) for option in options)
    )
    if unconditional is None:
        return list(await conditional), None
    both = await asyncio.gather(conditional, unconditional.of(options))
    return list(both[0]), both[1]


def _checked(options: Any, what: str) -> list[str]:
    """The options as a list, or a ValueError that says what was expected (a lone string would
    be scored character by character; no options would fail deep in pandas)."""
    if isinstance(options, str | bytes) or not isinstance(
        options, Sequence | np.ndarray | pd.Series
    ):
        raise ValueError(f"{what} must be a list of strings, got {type(options).__name__}")
    if len(options) == 0:
        raise ValueError(f"{what} is empty: give at least one option to score")
    if not all(isinstance(o, str) for o in options):
        raise ValueError(f"{what} must be strings, got {[type(o).__name__ for o in options]}")
    return list(options)


async def choose(
    backend: ScoringBackend,
    prompt: Any,
    options: Sequence[str],
    *,
    chat: bool | None = None,
    method: Method = DEFAULT_METHOD,
    unconditional: str | None = None,
) -> pd.DataFrame:
    """``option_likelihoods`` of ``options`` after ``prompt`` (with ``unconditional``: also
    after that neutral context, for PMI)."""
    options = _checked(options, "options")
    neutral = (
        None if unconditional is None else _Unconditional(backend, unconditional, chat, method)
    )
    scorings, alone = await _score_question(backend, prompt, options, chat, method, neutral)
    return option_likelihoods(scorings, options, unconditional=alone)


async def choose_many(
    backend: ScoringBackend,
    questions: pd.DataFrame,
    *,
    question: str = "question",
    options: str = "options",
    answer: str | None = "answer",
    chat: bool | None = None,
    method: Method = DEFAULT_METHOD,
    unconditional: str | None = None,
    concurrency: int = 4,
    progress: bool = True,
) -> pd.DataFrame:
    """``multiple_choice_frame`` over a DataFrame with a prompt column (``question``), a column
    of option lists (``options``) and optionally the answers (``answer``: option text or index;
    a missing column or value means unknown). Indexed by (the questions' index, option_index)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    for column in (question, options):
        if column not in questions:
            raise ValueError(f"the questions frame has no column {column!r}")
    for key, opts in zip(questions.index, questions[options], strict=True):
        _checked(opts, f"the options of question {key!r}")
    answers = (
        questions[answer].tolist()
        if answer is not None and answer in questions
        else [None] * len(questions)
    )
    neutral = (
        None if unconditional is None else _Unconditional(backend, unconditional, chat, method)
    )
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions), unit="question", desc="choosing", disable=not progress)

    async def one(prompt: Any, opts: Sequence[str]) -> tuple[list[Any], list[Any] | None]:
        async with gate:
            result = await _score_question(backend, prompt, list(opts), chat, method, neutral)
        bar.update(1)
        return result

    try:
        results = await asyncio.gather(
            *(
                one(p, o)
                for p, o in zip(questions[question].tolist(), questions[options], strict=True)
            )
        )
    finally:
        bar.close()
    return multiple_choice_frame(
        [
            (scorings, list(opts), gold, alone)
            for (scorings, alone), opts, gold in zip(
                results, questions[options], answers, strict=True
            )
        ],
        labels=questions.index,
    )
