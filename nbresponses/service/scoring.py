"""Logprobs of given token ids in this kernel: what every scoring is made of.

A scoring is a Response whose output tokens were given, not generated. ``Scorer`` asks the
token source for the logprob (with its exact ``rank`` and the ``entropy`` of its distribution)
of every given token after a context, and ``scoring_response`` wraps them in an
``openai.types.responses.Response`` marked as given (``traffic.events.GIVEN_METADATA``), so
every frame, the heat map and ``perplexity`` read it unchanged. The analyses
(``nbresponses.analysis``: text to ids, multiple choice, divergence, word starts) and the
Completions endpoint's prompt logprobs (``service/completions.py``) are built on it.

Two ways to compute, both deterministic (a function of the ids alone):

- ``method="prefill"`` (the default everywhere: ``DEFAULT_METHOD``): every position in
  prefill runs of 256 tokens, many tokens per run (the fast way to score a corpus). On the
  fused recipes (the default 8-bit one, ``analysis``) these are the very bits a decode step
  gives (docs/concepts/determinism.md).
- ``method="decode"``: the given tokens are forced through the same decode steps a
  generation takes (``SamplingParams.forced_tokens``), batched with whatever else runs: the
  logprobs of a generated text are bit for bit those it streamed on every recipe, and a
  source without prefill scoring (``ScoringSource``) can still score.

Text longer than the context is scored in windows of the context length (less one): the first
scores its tokens from the start, each later one the next half-context, conditioned on the
half-context before it (``windows``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
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
from nbresponses.tokens.contract import (
    SamplingParams,
    ScoringSource,
    TokenIdLogprob,
    TokenSource,
    TokenStream,
)
from nbresponses.traffic.events import GIVEN_METADATA

Method = Literal["prefill", "decode"]
METHODS: tuple[Method, ...] = ("prefill", "decode")
DEFAULT_METHOD: Method = "prefill"  # one default for every scoring, local or remote


def check_method(method: object) -> None:
    """A scoring method is one of ``METHODS``; anything else is the caller's mistake."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


@dataclass(frozen=True)
class PerPosition:
    """A float to keep of each scored position's full distribution (``name``: the logprob
    entry's extra field; ``reduce``: log-softmax vector -> float)."""

    name: str
    reduce: Callable[[np.ndarray], float]


@dataclass(frozen=True)
class Scoring:
    """What to score: ``prompt`` ids (context only) and the ``given`` ids to score after them."""

    prompt: list[int]
    given: list[int]


class Scorer:
    """Scores given token ids on a token source; the family reads the ids back to text."""

    def __init__(self, source: TokenSource, family: Family, *, model: str) -> None:
        self.source = source
        self.family = family
        self.model = model

    def document_start(self) -> int:
        """The token plain text is scored after (there is no start-of-text to predict the first
        token from otherwise: lm-evaluation-harness does the same)."""
        eos = list(self.source.eos_token_ids)
        if not eos:
            raise ValueError("scoring plain text needs an end-of-text token to start from")
        return int(eos[0])

    async def score_tokens(
        self,
        job: Scoring,
        *,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        per_position: PerPosition | None = None,
    ) -> Response:
        """A scoring Response of ``job.given`` after ``job.prompt``. With ``per_position``
        (a name and a function of a position's full log-softmax to one float), each entry also
        carries that float under the name, and the last one ``<name>_after``, the same one
        step after the last token (on an end-of-text token)."""
        started = time.time()
        reduce = per_position.reduce if per_position is not None else None
        logprobs, cached, values = await self.logprobs_and(job, top_logprobs, method, reduce)
        extras: list[dict[str, float]] | None = None
        if per_position is not None:  # one value per given token, and the one after the last
            extras = [{per_position.name: v} for v in values[: len(job.given)]]
            extras[-1][per_position.name + "_after"] = values[-1]
        return self._response(job, logprobs, method, started, cached, extras)

    async def logprobs(
        self, job: Scoring, *, top_logprobs: int = 0, method: Method = DEFAULT_METHOD
    ) -> tuple[list[TokenIdLogprob], int]:
        """The engine's logprob (with rank and entropy) of each of ``job.given``, and how many
        context tokens came from the prefix cache: what every scoring, over any API, is made
        of (the Completions API's prompt logprobs too)."""
        logprobs, cached, _ = await self.logprobs_and(job, top_logprobs, method, None)
        return logprobs, cached

    async def logprobs_and(
        self,
        job: Scoring,
        top_logprobs: int,
        method: Method,
        reduce: Callable[[np.ndarray], float] | None,
    ) -> tuple[list[TokenIdLogprob], int, list[float]]:
        """``logprobs``, and with ``reduce`` one float of each position's full distribution and
        of the one after the last given token (one more step, on an end-of-text token): the
        distributions are reduced as they arrive, never all held."""
        check_method(method)
        if not job.given:
            raise ValueError("nothing to score: the text has no tokens")
        logprobs: list[TokenIdLogprob] = []
        values: list[float] = []
        run = job
        if reduce is not None:  # one more position: the distribution after the last given token
            run = Scoring(job.prompt, [*job.given, self.document_start()])
        cached = 0
        for prompt, given in windows(run, self.source.context_length):
            steps = self._steps(prompt, given, top_logprobs, method, reduce is not None)
            async for step in steps:
                if step.finish_reason in ("error", "cancelled"):
                    raise RuntimeError(f"scoring ended: {step.error or step.finish_reason}")
                if step.stats is not None:
                    cached += step.stats.cached_tokens
                for lp in step.logprobs or ():
                    if reduce is not None:  # keep one float, never the whole distribution
                        if lp.distribution is None:
                            raise ValueError(self._no_distributions())
                        values.append(reduce(lp.distribution))
                        lp = dataclasses.replace(lp, distribution=None)
                    logprobs.append(lp)
        if len(logprobs) != len(run.given):
            raise RuntimeError(f"scored {len(logprobs)} of {len(run.given)} tokens")
        return logprobs[: len(job.given)], cached, values

    async def distributions(
        self, context: list[int], given: list[int], method: Method = DEFAULT_METHOD
    ) -> list[TokenIdLogprob]:
        """Each of ``given`` after ``context`` with its full next-token distribution (one
        window: the caller keeps ``context + given`` within the context length)."""
        check_method(method)
        out: list[TokenIdLogprob] = []
        async for step in self._steps(context, given, 0, method, True):
            if step.finish_reason in ("error", "cancelled"):
                raise RuntimeError(f"scoring ended: {step.error or step.finish_reason}")
            out.extend(step.logprobs or ())
        if len(out) != len(given) or any(lp.distribution is None for lp in out):
            raise ValueError(self._no_distributions())
        return out

    def _no_distributions(self) -> str:
        return f"{type(self.source).__name__} does not give the full distributions"

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
    and any ``extra`` ones (a ``PerPosition`` value: ``word_start_logmass``)."""
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
