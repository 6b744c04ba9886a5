"""The analyses as methods, written once: ``nbr.Engine`` and ``nbr.RemoteEngine`` inherit them.

Each method reads ``self.scoring`` (a ``ScoringBackend``: this kernel's engine, or a server)
and nothing else of the engine, so an engine exposes an analysis by holding a backend, and a
backend that cannot do one (a server has no full distributions) says so in its error.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from openai.types.responses import Response
from tqdm.auto import tqdm

from nbresponses.service.scoring import DEFAULT_METHOD, Method

from .backend import ScoringBackend, is_responses

if TYPE_CHECKING:
    import pandas as pd

# The frames (pandas) are imported by the methods that build them, not here: every engine
# imports this module, and pandas added 2.5 s to `import nbresponses.engine` (measured on a
# loaded machine; `nbresponses serve` and generation never build a frame).

__all__ = ["Analyses"]


class Analyses:
    """Scoring, multiple choice, divergence and the logit lens on ``self.scoring``."""

    scoring: ScoringBackend

    async def score(
        self,
        text: str | Sequence[Any] | Response,
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int | None = None,
        method: Method = DEFAULT_METHOD,
        word_starts: bool = False,
        input: Any = None,
    ) -> Response | list[Response]:
        """The logprob, exact rank, entropy and ``top_logprobs`` alternatives of every given
        token, as a Response (``nbr.logprobs_frame``, ``nbr.show`` and the analyses read it).

        ``text`` alone: plain text, every token scored. With ``continuation``: the
        continuation's tokens after ``text`` (plain, or a chat prompt with ``chat=True``). A
        list of chat messages ending with an assistant turn: that turn. ``method="prefill"``
        (the default everywhere) scores many tokens per run; ``"decode"`` computes each token
        as a generation does (on the fused recipes both give the same bits; see
        ``nbresponses.service.scoring``). ``word_starts=True`` adds each position's probability
        of a word-start token, for ``nbr.words_frame(..., bow_correction=True)``.

        A generated ``Response`` (or a list of them): its own tokens, read from its logprobs,
        after the prompt it answered (from this engine's store, or rendered from ``input=``),
        so the rows line up one to one with ``nbr.logprobs_frame(response)``; ``top_logprobs``
        defaults to the response's. See ``nbresponses.analysis.rescore``.
        """
        if is_responses(text):
            if continuation is not None or chat is not None or word_starts:
                raise ValueError(
                    "a Response is scored on its own tokens and prompt: no continuation, chat "
                    "or word_starts"
                )
            if isinstance(text, Response):
                return await self._score_own(text, input, top_logprobs, method)
            inputs = [None] * len(text) if input is None else list(input)
            if len(inputs) != len(text):
                raise ValueError(f"{len(inputs)} inputs for {len(text)} responses")
            return list(
                await asyncio.gather(
                    *(
                        self._score_own(r, i, top_logprobs, method)
                        for r, i in zip(text, inputs, strict=True)
                    )
                )
            )
        if input is not None:
            raise ValueError("input= goes with scoring a Response's own tokens")
        return await self.scoring.score_text(
            text,  # type: ignore[arg-type]
            continuation,
            chat=chat,
            top_logprobs=top_logprobs or 0,
            method=method,
            word_starts=word_starts,
        )

    async def _score_own(
        self, response: Response, input: Any, top_logprobs: int | None, method: Method
    ) -> Response:
        job = await self.scoring.own_tokens(response, input)
        top = response.top_logprobs or 0 if top_logprobs is None else top_logprobs
        return await self.scoring.score(job, top_logprobs=top, method=method)

    async def score_many(
        self,
        texts: Iterable[str | Sequence[Any] | tuple[str, str]],
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        concurrency: int = 8,
        progress: bool = True,
        word_starts: bool = False,
    ) -> AsyncIterator[Response]:
        """Score many texts (or ``(prompt, continuation)`` pairs), ``concurrency`` at a time so
        the engine batches them, and yield the scorings in input order, with a progress bar;
        ``nbr.logprobs_frame(list_of_them)`` makes one frame of them all. Memory stays bounded
        by ``concurrency``; leaving the loop early cancels what is still being scored."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        items = iter(texts)
        total = len(texts) if hasattr(texts, "__len__") else None  # type: ignore[arg-type]
        bar = tqdm(total=total, unit="text", desc="scoring", disable=not progress)
        pending: list[asyncio.Task[Response]] = []
        options: dict[str, Any] = {"chat": chat, "top_logprobs": top_logprobs,
                                   "method": method, "word_starts": word_starts}  # fmt: skip

        def start_next() -> bool:
            item = next(items, None)
            if item is None:
                return False
            pair = item if isinstance(item, tuple) else (item, None)
            pending.append(asyncio.ensure_future(self.scoring.score_text(*pair, **options)))
            return True

        try:
            while len(pending) < concurrency and start_next():
                pass
            while pending:
                result = await pending.pop(0)
                bar.update(1)
                start_next()
                yield result
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)  # their rows are freed
            bar.close()

    async def score_frame(self, texts: Sequence[Any], **options: Any) -> pd.DataFrame:
        """``score_many`` into one ``logprobs_frame``, with a ``document`` column (the index of
        each token's text in ``texts``)."""
        from nbresponses.frames.scoring import scorings_frame  # pandas: see the top

        return scorings_frame([s async for s in self.score_many(texts, **options)])

    async def choose(
        self,
        prompt: str | Sequence[Any],
        options: Sequence[str],
        *,
        chat: bool | None = None,
        method: Method = DEFAULT_METHOD,
        unconditional: str | None = None,
    ) -> pd.DataFrame:
        """How likely the model finds each option as the continuation of ``prompt``: a
        DataFrame with the summed logprob and its per-token, per-character and per-byte
        normalisations, each as a probability among the options
        (``nbresponses.frames.choice``: lm-evaluation-harness's definitions). With
        ``unconditional`` (a neutral context such as ``""`` or ``"Answer:"``), also each
        option's logprob after it and the PMI score. The prompt is computed once and shared
        (prefix cache); the options are scored together."""
        from .choice import choose  # pandas: see the top

        return await choose(
            self.scoring, prompt, options, chat=chat, method=method, unconditional=unconditional
        )

    async def choose_many(
        self,
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
        """``choose`` over a DataFrame of questions (a prompt column, a column of option lists,
        optionally the answers): one row per (question, option) with every score and
        ``correct``; ``nbr.choice_accuracy`` of it gives the prediction, probability, accuracy
        and Brier score per normalisation. ``concurrency`` questions at a time, with a bar."""
        from .choice import choose_many  # pandas: see the top

        return await choose_many(
            self.scoring,
            questions,
            question=question,
            options=options,
            answer=answer,
            chat=chat,
            method=method,
            unconditional=unconditional,
            concurrency=concurrency,
            progress=progress,
        )

    async def divergence(
        self,
        other: Analyses,
        texts: Iterable[str],
        *,
        names: tuple[str, str] = ("a", "b"),
        method: Method = DEFAULT_METHOD,
        chunk: int = 256,
        progress: bool = True,
    ) -> pd.DataFrame:
        """This engine (the base, ``a``) against ``other`` (``b``, e.g. another recipe of the
        same model) on the same tokens of ``texts``: one row per token with the exact
        full-vocabulary KL(a ‖ b), Δp of the token, both ranks and whether the top-1 agrees,
        computed streaming in chunks (never every logit at once), with a progress bar.
        ``nbr.divergence_summary`` of it is llama.cpp's KL-divergence report. (Two scorings
        already made compare with ``nbr.compare_scorings``, over their top-k.)"""
        from .divergence import divergence  # pandas: see the top

        return await divergence(
            self.scoring,
            other.scoring,
            texts,
            names=names,
            method=method,
            chunk=chunk,
            progress=progress,
        )

    async def compare(self, other: Analyses, texts: Iterable[str], **options: Any) -> Any:
        """Deprecated: ``divergence`` (``compare`` also named ``nbr.compare``'s top-k KL)."""
        warnings.warn(
            "engine.compare(other, texts) is now engine.divergence(other, texts)",
            DeprecationWarning,
            stacklevel=2,
        )
        return await self.divergence(other, texts, **options)

    async def logit_lens(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
    ) -> pd.DataFrame:
        """Where a prediction forms: for every layer (0 = the embeddings .. the model's output)
        and position, the next-token distribution read from that layer's residual stream
        through the model's own final norm and LM head (``nbr.frames.lens_frame`` columns:
        top tokens, the probability and rank of the token that actually comes next, the KL
        divergence from the last layer). ``nbr.plot_lens(frame)`` draws it.

        The tokens are those ``score`` would score (``text`` alone: plain text after an
        end-of-text token; with ``continuation`` or ``chat``: as ``score`` takes them). Needs a
        fused recipe (``fused-q8``, ``analysis``); a lens graph is built once beside the model.
        On 8-bit weights it reads what that model computes (docs/concepts/lens.md).
        """
        from nbresponses.frames.lens import lens_frame  # pandas: see the top

        job = await self.scoring.prepare(text, continuation, chat=chat)
        ids = [*job.prompt, *job.given]
        result, names = await self.scoring.lens(ids)
        return lens_frame(
            tokens=[names[t] for t in ids],
            top_tokens=np.vectorize(names.__getitem__, otypes=[object])(result.top_ids),
            top_logprobs=result.top_logprobs,
            next_logprob=result.next_logprob,
            next_rank=result.next_rank,
            kl=result.kl,
        )
