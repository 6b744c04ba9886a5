"""Logprobs of given text: a scoring is a Response whose output tokens were given, not generated.

``Scorer.score`` tokenizes what it is given (raw text, or a chat conversation rendered by the
model's family), asks the token source for the logprob of every given token, and returns an
``openai.types.responses.Response`` whose output text carries them, so every frame, the heat
map and ``perplexity`` read it unchanged. Its metadata marks it (``traffic.events.
GIVEN_METADATA``); each logprob entry also carries the token's exact ``rank`` in the vocabulary
and the ``entropy`` of the distribution it was drawn from (extra fields of OpenAI's type).

Two ways to compute, both deterministic (a function of the text alone):

- ``method="decode"`` (default): the given tokens are forced through the same decode steps a
  generation takes (``SamplingParams.forced_tokens``), batched with whatever else runs: the
  logprobs of a text the model generated are bit for bit those it streamed.
- ``method="prefill"``: every position in prefill runs of 256 tokens, many tokens per run
  (the fast way to score a corpus). ONNX Runtime sums a prefill position in another order
  than a decode step: on fp32 weights the two agree to ~1e-6; the 8-bit default's int8
  activations amplify that to ~0.05 nats on average (docs/concepts/determinism.md).

What is scored: with ``continuation``, its tokens, after the prompt (raw text, or a chat
prompt ending with the assistant's opening); a conversation ending with an assistant turn
scores that turn; plain text scores every token, after one end-of-text token (there is no
start-of-text to predict the first token from otherwise: lm-evaluation-harness does the same).
Text longer than the context is scored in windows of the context length (less one): the first
scores its tokens from the start, each later one the next half-context, conditioned on the
half-context before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from nbresponses.families.base import Family
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.request import parse_create
from nbresponses.tokens.contract import (
    GenerationStats,
    SamplingParams,
    ScoringSource,
    Step,
    TokenIdLogprob,
    TokenSource,
)
from nbresponses.traffic.events import GIVEN_METADATA

Method = Literal["decode", "prefill"]
METHODS = ("decode", "prefill")


@dataclass(frozen=True)
class Scoring:
    """What to score: ``prompt`` ids (context only) and the ``given`` ids to score after them."""

    prompt: list[int]
    given: list[int]


class ScorerBase:
    """What every scorer offers on top of its own ``score``: many texts, batched, in order."""

    async def score(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Any = "decode",
    ) -> Response:
        raise NotImplementedError

    async def choose(
        self,
        prompt: str | Sequence[Any],
        options: Sequence[str],
        *,
        chat: bool | None = None,
        method: Any = "decode",
    ) -> Any:
        """Each option scored as the continuation of ``prompt``, all at once (they share the
        prompt's prefix), read into ``option_likelihoods``' frame."""
        from nbresponses.frames.scoring import option_likelihoods

        scorings = await asyncio.gather(
            *(self.score(prompt, option, chat=chat, method=method) for option in options)
        )
        return option_likelihoods(scorings, options)

    async def score_frame(self, texts: Sequence[Any], **options: Any) -> Any:
        """``score_many`` into one ``logprobs_frame``, with a ``document`` column (the index
        of each token's text in ``texts``)."""
        from nbresponses.frames import logprobs_frame

        scorings = [s async for s in self.score_many(texts, **options)]
        ids = {s.id: i for i, s in enumerate(scorings)}
        frame = logprobs_frame(scorings)
        frame.insert(0, "document", frame["response_id"].astype(str).map(ids).astype("int64"))
        return frame

    async def score_many(
        self,
        texts: Iterable[str | Sequence[Any] | tuple[str, str]],
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Any = "decode",
        concurrency: int = 8,
        progress: bool = True,
    ) -> AsyncIterator[Response]:
        """Score each text (or ``(prompt, continuation)`` pair), ``concurrency`` at a time so
        the engine batches them, and yield the scorings in input order. Memory stays bounded
        by ``concurrency``; leaving the loop early cancels what is still being scored."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        from tqdm.auto import tqdm  # the engine extra's

        items = iter(texts)
        total = len(texts) if hasattr(texts, "__len__") else None  # type: ignore[arg-type]
        bar = tqdm(total=total, unit="text", desc="scoring", disable=not progress)
        pending: list[asyncio.Task[Response]] = []

        def start_next() -> bool:
            try:
                item = next(items)
            except StopIteration:
                return False
            if isinstance(item, tuple):
                job = self.score(item[0], item[1], chat=chat, top_logprobs=top_logprobs,
                                 method=method)  # fmt: skip
            else:
                job = self.score(item, chat=chat, top_logprobs=top_logprobs, method=method)
            pending.append(asyncio.ensure_future(job))
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


class Scorer(ScorerBase):
    """Scores given text on a token source with a model family's tokenization."""

    def __init__(self, source: TokenSource, family: Family, *, model: str) -> None:
        self.source = source
        self.family = family
        self.model = model

    # -- what to score -----------------------------------------------------------------------

    def prepare(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
    ) -> Scoring:
        """Token ids of the context and of the text to score (see the module docstring)."""
        messages = not isinstance(text, str)
        chat = messages if chat is None else chat
        if messages and not chat:
            raise ValueError("a list of messages is scored with its chat template: chat=True")
        if chat:
            history: list[Any] = (
                [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
            )
            if continuation is None:
                last = history[-1] if history else {}
                role = last.get("role") if isinstance(last, dict) else getattr(last, "role", None)
                if role != "assistant":
                    raise ValueError(
                        "nothing to score: give a continuation, or end the conversation with "
                        "an assistant turn"
                    )
                content = last.get("content") if isinstance(last, dict) else last.content
                if not isinstance(content, str):
                    raise ValueError("the scored assistant turn must be plain text")
                continuation, history = content, history[:-1]
            req = parse_create({"input": history}, model=self.model)
            prompt = self.family.render(req, req.input).ids
            return Scoring(list(prompt), self.family.encode(continuation))
        assert isinstance(text, str)
        if continuation is None:
            return Scoring([self._document_start()], self.family.encode(text))
        return Scoring(self.family.encode(text), self.family.encode(continuation))

    def _document_start(self) -> int:
        eos = list(self.source.eos_token_ids)
        if not eos:
            raise ValueError("scoring plain text needs an end-of-text token to start from")
        return int(eos[0])

    # -- scoring -----------------------------------------------------------------------------

    async def score(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Method = "decode",
    ) -> Response:
        """A Response whose output text holds the given tokens with their logprobs."""
        return await self.score_tokens(
            self.prepare(text, continuation, chat=chat), top_logprobs=top_logprobs, method=method
        )

    async def score_tokens(
        self, job: Scoring, *, top_logprobs: int = 0, method: Method = "decode"
    ) -> Response:
        """Score ``job.given`` after ``job.prompt`` (token ids), as ``score`` does."""
        started = time.time()
        logprobs, cached = await self.logprobs(job, top_logprobs=top_logprobs, method=method)
        return self._response(job, logprobs, method, started, cached)

    async def logprobs(
        self, job: Scoring, *, top_logprobs: int = 0, method: Method = "decode"
    ) -> tuple[list[TokenIdLogprob], int]:
        """The engine's logprob (with rank and entropy) of each of ``job.given``, and how many
        context tokens came from the prefix cache: what every scoring, over any API, is made
        of (the Completions API's prompt logprobs too)."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if not job.given:
            raise ValueError("nothing to score: the text has no tokens")
        logprobs: list[TokenIdLogprob] = []
        cached = 0
        for prompt, given in self._windows(job):
            stats = GenerationStats()
            async for step in self._steps(prompt, given, top_logprobs, method, stats):
                if step.finish_reason in ("error", "cancelled"):
                    raise RuntimeError(f"scoring ended: {step.error or step.finish_reason}")
                logprobs.extend(step.logprobs or ())
            cached += stats.cached_tokens
        if len(logprobs) != len(job.given):
            raise RuntimeError(f"scored {len(logprobs)} of {len(job.given)} tokens")
        return logprobs, cached

    def _windows(self, job: Scoring) -> Iterable[tuple[list[int], list[int]]]:
        return windows(job, self.source.context_length)

    def _steps(
        self,
        prompt: list[int],
        given: list[int],
        top_logprobs: int,
        method: Method,
        stats: GenerationStats,
    ) -> AsyncIterator[Step]:
        if method == "prefill":
            if not isinstance(self.source, ScoringSource):
                raise ValueError(
                    f"method='prefill' needs a source that scores in prefill runs; "
                    f"{type(self.source).__name__} does not (use method='decode')"
                )
            return self.source.score(
                [*prompt, *given], start=len(prompt), top_logprobs=top_logprobs, stats=stats
            )
        params = SamplingParams(
            max_tokens=len(given),
            temperature=0,
            logprobs=True,
            top_logprobs=top_logprobs,
            forced_tokens=tuple(given),
            details=True,
        )
        return self.source.generate(prompt, params, stats)

    def _response(
        self,
        job: Scoring,
        logprobs: list[TokenIdLogprob],
        method: Method,
        started: float,
        cached: int,
    ) -> Response:
        entries = []
        for lp in logprobs:
            given = self.family.token_logprob(lp)
            top = [LogprobTopLogprob(token=t, bytes=b, logprob=v) for t, b, v in given.top]
            entries.append(
                given_logprob(given.token, given.bytes, given.logprob, top, lp.rank, lp.entropy)
            )
        return scoring_response(
            self.model,
            self.family.decode(job.given),
            entries,
            prompt_tokens=len(job.prompt),
            cached_tokens=cached,
            metadata={"nbresponses.method": method},
            started=started,
        )


def windows(job: Scoring, context_length: int) -> Iterable[tuple[list[int], list[int]]]:
    """(context, tokens to score) per window of the context length (less one: a cold
    window of odd length takes a dummy token after it, docs/concepts/determinism.md)."""
    window = context_length - 1
    if len(job.prompt) + len(job.given) <= window:
        yield job.prompt, job.given
        return
    if len(job.prompt) >= window // 2:
        raise ValueError(
            f"the prompt has {len(job.prompt)} tokens: more than half this model's context "
            f"({window}) leaves no room to score a long continuation in windows"
        )
    first = window - len(job.prompt)
    yield job.prompt, job.given[:first]
    half = window // 2
    done = first
    while done < len(job.given):
        yield job.given[done - half : done], job.given[done : done + half]
        done += half


def given_logprob(
    token: str,
    token_bytes: list[int],
    logprob: float,
    top: list[LogprobTopLogprob],
    rank: int | None,
    entropy: float | None,
) -> Logprob:
    """OpenAI's logprob entry with our extra fields (the type keeps them): rank and entropy."""
    return Logprob.model_validate(
        {
            "token": token,
            "bytes": token_bytes,
            "logprob": logprob,
            "top_logprobs": top,
            "rank": rank,
            "entropy": entropy,
        }
    )


def scoring_response(
    model: str,
    text: str,
    entries: list[Logprob],
    *,
    prompt_tokens: int,
    cached_tokens: int,
    metadata: dict[str, str],
    started: float,
) -> Response:
    """A scoring: a Response whose output text holds the given tokens and their logprobs,
    marked as given (``GIVEN_METADATA``), so the frames and the view read it as they read
    any Response; wherever it was computed (this kernel or a server)."""
    part = ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=entries)
    message = ResponseOutputMessage(
        type="message", id=new_id("msg"), role="assistant", status="completed", content=[part]
    )
    usage = ResponseUsage(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=min(cached_tokens, prompt_tokens), cache_write_tokens=0
        ),
        output_tokens=len(entries),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=prompt_tokens + len(entries),
    )
    return Response(
        id=new_id("resp"),
        object="response",
        created_at=started,
        completed_at=time.time(),
        model=model,
        status="completed",
        output=[message],
        parallel_tool_calls=False,
        tool_choice="none",
        tools=[],
        usage=usage,
        metadata={GIVEN_METADATA: "1", **metadata},
    )
