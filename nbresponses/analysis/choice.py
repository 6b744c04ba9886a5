"""Multiple choice on the engine: score each option after its question (and, for PMI, after a
neutral context), batched, into the frames of ``nbresponses.frames.choice``.

The options of one question are submitted together, so they run in one batch and share the
question's prompt through the prefix cache; several questions run ``concurrency`` at a time.
The unconditional scorings depend on the option text alone: each distinct option is scored
after the neutral context once. Any scorer will do (``ScorerBase``): this kernel's, or a
server's (``nbr.RemoteEngine``, whose ``method`` None is the server's own way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pandas as pd

from nbresponses.frames.choice import multiple_choice_frame, option_likelihoods

from .scoring import Method, ScorerBase

__all__ = ["choose", "choose_many"]


class _Unconditional:
    """Scorings of options after the neutral context, each distinct option once."""

    def __init__(
        self, scorer: ScorerBase, context: str, chat: bool | None, method: Method | None
    ) -> None:
        self.scorer, self.context, self.chat, self.method = scorer, context, chat, method
        self._tasks: dict[str, asyncio.Future[Any]] = {}

    async def of(self, options: Sequence[str]) -> list[Any]:
        for option in options:
            if option not in self._tasks:
                self._tasks[option] = asyncio.ensure_future(
                    self.scorer.score(self.context, option, chat=self.chat, method=self.method)
                )
        return list(await asyncio.gather(*(self._tasks[o] for o in options)))


async def _score_question(
    scorer: ScorerBase,
    prompt: Any,
    options: Sequence[str],
    chat: bool | None,
    method: Method | None,
    unconditional: _Unconditional | None,
) -> tuple[list[Any], list[Any] | None]:
    conditional = asyncio.gather(
        *(scorer.score(prompt, option, chat=chat, method=method) for option in options)
    )
    if unconditional is None:
        return list(await conditional), None
    both = await asyncio.gather(conditional, unconditional.of(options))
    return list(both[0]), both[1]


async def choose(
    scorer: ScorerBase,
    prompt: Any,
    options: Sequence[str],
    *,
    chat: bool | None = None,
    method: Method | None = "decode",
    unconditional: str | None = None,
) -> pd.DataFrame:
    """``option_likelihoods`` of ``options`` after ``prompt`` (with ``unconditional``: also
    after that neutral context, for PMI)."""
    options = list(options)
    neutral = None if unconditional is None else _Unconditional(scorer, unconditional, chat, method)
    scorings, alone = await _score_question(scorer, prompt, options, chat, method, neutral)
    return option_likelihoods(scorings, options, unconditional=alone)


async def choose_many(
    scorer: ScorerBase,
    questions: pd.DataFrame,
    *,
    question: str = "question",
    options: str = "options",
    answer: str | None = "answer",
    chat: bool | None = None,
    method: Method | None = "decode",
    unconditional: str | None = None,
    concurrency: int = 4,
    progress: bool = True,
) -> pd.DataFrame:
    """``multiple_choice_frame`` over a DataFrame with a prompt column (``question``), a column
    of option lists (``options``) and optionally the answers (``answer``: option text or index;
    a missing column or value means unknown). Indexed by (the questions' index, option_index)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    from tqdm.auto import tqdm

    for column in (question, options):
        if column not in questions:
            raise ValueError(f"the questions frame has no column {column!r}")
    answers = (
        questions[answer].tolist()
        if answer is not None and answer in questions
        else [None] * len(questions)
    )
    neutral = None if unconditional is None else _Unconditional(scorer, unconditional, chat, method)
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions), unit="question", desc="choosing", disable=not progress)

    async def one(prompt: Any, opts: Sequence[str]) -> tuple[list[Any], list[Any] | None]:
        async with gate:
            result = await _score_question(scorer, prompt, list(opts), chat, method, neutral)
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
    frame = multiple_choice_frame(
        [
            (scorings, list(opts), gold, alone)
            for (scorings, alone), opts, gold in zip(
                results, questions[options], answers, strict=True
            )
        ]
    )
    labels = questions.index.to_numpy()[frame.index.get_level_values("question")]
    frame.index = pd.MultiIndex.from_arrays(
        [labels, frame.index.get_level_values("option_index")],
        names=[questions.index.name or "question", "option_index"],
    )
    return frame
