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

With ``word_starts=True`` each entry also carries ``word_start_logmass``: log of the
probability, at that position, of any token that starts a word (whitespace first, or
end-of-text), and the last entry ``word_start_logmass_after``, the same after the last token
(one more step, on an end-of-text token): what ``words_frame(..., bow_correction=True)`` needs
(``service/word_starts.py``). It needs the full distributions, which only the in-kernel
engine gives: a remote scorer (``service/remote.py``) refuses it.

``ScorerBase`` holds what every scorer (this kernel's ``Scorer``, a server's ``RemoteScorer``)
builds on its ``score``: ``choose`` / ``choose_many`` (``service/choice.py``), ``score_many``
and ``score_frame``. ``windows``, ``given_logprob`` and ``scoring_response`` are shared with
the Completions endpoint (``service/completions.py``) and the remote scorer, so a scoring has
one shape wherever it is computed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
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
    SamplingParams,
    ScoringSource,
    TokenIdLogprob,
    TokenSource,
    TokenStream,
)
from nbresponses.traffic.events import GIVEN_METADATA

from .word_starts import word_start_logmass, word_start_mask

Method = Literal["decode", "prefill"]
METHODS = ("decode", "prefill")


@dataclass(frozen=True)
class Scoring:
    """What to score: ``prompt`` ids (context only) and the ``given`` ids to score after them."""

    prompt: list[int]
    given: list[int]


class ScorerBase:
    """What every scorer offers on top of its own ``score``: multiple choice, and many texts,
    batched, in order."""

    async def score(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Any = "decode",
        word_starts: bool = False,
    ) -> Response:
        raise NotImplementedError

    async def choose(
        self,
        prompt: str | Sequence[Any],
        options: Sequence[str],
        *,
        chat: bool | None = None,
        method: Any = "decode",
        unconditional: str | None = None,
    ) -> Any:
        """Each option scored as the continuation of ``prompt``, all at once (they share the
        prompt's prefix), read into ``option_likelihoods``' frame: the summed logprob, its
        lm-evaluation-harness normalisations and, with ``unconditional``, PMI
        (``service/choice.py``)."""
        from .choice import choose

        return await choose(
            self, prompt, options, chat=chat, method=method, unconditional=unconditional
        )

    async def choose_many(self, questions: Any, **options: Any) -> Any:
        """``choose`` over a DataFrame of questions (``service.choice.choose_many``)."""
        from .choice import choose_many

        return await choose_many(self, questions, **options)

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
        word_starts: bool = False,
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
            options: dict[str, Any] = {"chat": chat, "top_logprobs": top_logprobs,
                                       "method": method, "word_starts": word_starts}  # fmt: skip
            if isinstance(item, tuple):
                job = self.score(item[0], item[1], **options)
            else:
                job = self.score(item, **options)
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
        # an empty context is the end-of-text token alone (lm-evaluation-harness does the same)
        context = self.family.encode(text) or [self._document_start()]
        return Scoring(context, self.family.encode(continuation))

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
        word_starts: bool = False,
    ) -> Response:
        """A Response whose output text holds the given tokens with their logprobs."""
        return await self.score_tokens(
            self.prepare(text, continuation, chat=chat),
            top_logprobs=top_logprobs,
            method=method,
            word_starts=word_starts,
        )

    async def score_tokens(
        self,
        job: Scoring,
        *,
        top_logprobs: int = 0,
        method: Method = "decode",
        word_starts: bool = False,
    ) -> Response:
        """Score ``job.given`` after ``job.prompt`` (token ids), as ``score`` does."""
        started = time.time()
        logprobs, cached, masses = await self._logprobs(job, top_logprobs, method, word_starts)
        extras: list[dict[str, float]] | None = None
        if word_starts:  # one mass per given token, and the one after the last
            extras = [{"word_start_logmass": m} for m in masses[: len(job.given)]]
            extras[-1]["word_start_logmass_after"] = masses[-1]
        return self._response(job, logprobs, method, started, cached, extras)

    async def logprobs(
        self, job: Scoring, *, top_logprobs: int = 0, method: Method = "decode"
    ) -> tuple[list[TokenIdLogprob], int]:
        """The engine's logprob (with rank and entropy) of each of ``job.given``, and how many
        context tokens came from the prefix cache: what every scoring, over any API, is made
        of (the Completions API's prompt logprobs too)."""
        logprobs, cached, _ = await self._logprobs(job, top_logprobs, method, False)
        return logprobs, cached

    async def _logprobs(
        self, job: Scoring, top_logprobs: int, method: Method, word_starts: bool
    ) -> tuple[list[TokenIdLogprob], int, list[float]]:
        """``logprobs``, and with ``word_starts`` the word-start log-mass of each position and
        of the one after the last given token (one more step, on an end-of-text token)."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if not job.given:
            raise ValueError("nothing to score: the text has no tokens")
        logprobs: list[TokenIdLogprob] = []
        masses: list[float] = []
        mask = None
        run = job
        if word_starts:  # one more position: the distribution after the last given token
            run = Scoring(job.prompt, [*job.given, self._document_start()])
        cached = 0
        for prompt, given in self._windows(run):
            steps = self._steps(prompt, given, top_logprobs, method, word_starts)
            async for step in steps:
                if step.finish_reason in ("error", "cancelled"):
                    raise RuntimeError(f"scoring ended: {step.error or step.finish_reason}")
                if step.stats is not None:
                    cached += step.stats.cached_tokens
                for lp in step.logprobs or ():
                    if word_starts:  # keep one float, never the whole distribution
                        if lp.distribution is None:
                            raise ValueError(
                                f"word_starts=True needs the full distributions, which "
                                f"{type(self.source).__name__} does not give"
                            )
                        if mask is None:
                            vocab = len(lp.distribution)
                            eos_ids = self.source.eos_token_ids
                            mask = word_start_mask(self.family, vocab, eos_ids)
                        masses.append(word_start_logmass(lp.distribution, mask))
                        lp = dataclasses.replace(lp, distribution=None)
                    logprobs.append(lp)
        if len(logprobs) != len(run.given):
            raise RuntimeError(f"scored {len(logprobs)} of {len(run.given)} tokens")
        return logprobs[: len(job.given)], cached, masses

    def _windows(self, job: Scoring) -> Iterable[tuple[list[int], list[int]]]:
        return windows(job, self.source.context_length)

    def _steps(
        self,
        prompt: list[int],
        given: list[int],
        top_logprobs: int,
        method: Method,
        distribution: bool = False,
    ) -> TokenStream:
        if method == "prefill":
            if not isinstance(self.source, ScoringSource):
                raise ValueError(
                    f"method='prefill' needs a source that scores in prefill runs; "
                    f"{type(self.source).__name__} does not (use method='decode')"
                )
            if distribution:
                return self.source.score(
                    [*prompt, *given],
                    start=len(prompt),
                    top_logprobs=top_logprobs,
                    distribution=True,
                )
            return self.source.score(
                [*prompt, *given], start=len(prompt), top_logprobs=top_logprobs
            )
        params = SamplingParams(
            max_tokens=len(given),
            temperature=0,
            logprobs=True,
            top_logprobs=top_logprobs,
            forced_tokens=tuple(given),
            details=True,
            distribution=distribution,
        )
        return self.source.generate(prompt, params)

    def _response(
        self,
        job: Scoring,
        logprobs: list[TokenIdLogprob],
        method: Method,
        started: float,
        cached: int,
        extras: list[dict[str, float]] | None = None,
    ) -> Response:
        entries = []
        for i, lp in enumerate(logprobs):
            given = self.family.token_logprob(lp)
            top = [LogprobTopLogprob(token=t, bytes=b, logprob=v) for t, b, v in given.top]
            entries.append(
                given_logprob(
                    given.token,
                    given.bytes,
                    given.logprob,
                    top,
                    lp.rank,
                    lp.entropy,
                    extras[i] if extras else None,
                )
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
    extra: Mapping[str, float] | None = None,
) -> Logprob:
    """OpenAI's logprob entry with our extra fields (the type keeps them): rank and entropy,
    and any ``extra`` ones (``word_start_logmass``: ``word_starts=True``)."""
    return Logprob.model_validate(
        {
            "token": token,
            "bytes": token_bytes,
            "logprob": logprob,
            "top_logprobs": top,
            "rank": rank,
            "entropy": entropy,
            **(extra or {}),
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
