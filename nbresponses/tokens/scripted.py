"""A token source that replays a script: drives protocol tests and users' own tests offline.

It honours the parts of the engine contract a consumer can observe: ``max_tokens`` (finish
"length"), end-of-sequence ids and ``stop_token_ids`` (finish "stop"), logprobs only when asked
(with exactly ``top_logprobs`` alternatives), usage counts in the final step's
``GenerationStats``, and cancellation (``cancel()`` ends the stream with a "cancelled" step;
closing the iterator or cancelling the consuming task stops it at once). A grammar
(``params.constraint``) is checked as the engine applies it: each scripted token must be one the
mask allows, else the generation ends with finish "error" naming the token (a script is not a
model: it cannot pick another token, so a test sees the grammar refuse it). Budget-aware closing
(``tokens/closing.py``) applies as in the engine: once a scripted token leaves no room for the
way to the grammar's end, the source writes that way instead of the script, and ends "length"; a
``whole`` constraint whose shortest output does not fit the budget ends "length" before its
first token. ``logit_bias`` is honoured where a script can be: the script is what was chosen
after the bias, so a scripted token the bias bans (-100 or less, OpenAI's ban) ends the
generation with finish "error" naming it, as a grammar's refusal does; other biases change
nothing a script writes (its logprobs are given, not computed)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbresponses.tokens.closing import BudgetClosing
from nbresponses.tokens.contract import (
    FinishReason,
    GenerationStats,
    SamplingParams,
    Step,
    TokenConstraint,
    TokenIdLogprob,
)

BAN = -100.0  # a logit_bias this low bans a token (OpenAI: "-100 should result in a ban")


@dataclass
class Script:
    """One scripted generation.

    ``logprobs`` gives one chosen-token logprob per token (defaults to a fixed value) and
    ``processed_logprobs`` its processed logprob (default: the raw one); the alternatives are
    made up deterministically from ``alternatives`` ids. ``finish`` is what happens when the
    script runs out ("stop" unless told otherwise); ``error`` makes the source fail with that
    message after ``error_after`` tokens. ``delay`` is slept between steps.
    """

    token_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    finish: FinishReason = "stop"
    error: str | None = None
    error_after: int = 0
    raise_error: bool = False
    delay: float = 0.0
    cached_tokens: int = 0
    processed_logprobs: Sequence[float] | None = None  # sent when the request asks for them
    alternatives: Sequence[int] = field(default_factory=lambda: tuple(range(100, 140)))


class ScriptedTokenSource:
    """Replays scripts in order (one per ``generate`` call; the last one repeats).

    ``prompts`` records every prompt it was given, ``params`` every ``SamplingParams``, and
    ``cancelled`` counts generations that were stopped before their end.
    """

    def __init__(
        self,
        scripts: Sequence[Script | Sequence[int]],
        *,
        eos_token_ids: Sequence[int] = (2,),
        context_length: int = 8192,
    ) -> None:
        self._scripts = [s if isinstance(s, Script) else Script(list(s)) for s in scripts]
        if not self._scripts:
            raise ValueError("ScriptedTokenSource needs at least one script")
        self._eos = tuple(eos_token_ids)
        self._context_length = context_length
        self._calls = 0
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.cancelled = 0

    @property
    def eos_token_ids(self) -> Sequence[int]:
        return self._eos

    @property
    def context_length(self) -> int:
        return self._context_length

    def stats(self) -> dict[str, Any]:
        return {"requests": self._calls, "cancelled": self.cancelled}

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> ScriptedStream:
        script = self._scripts[min(self._calls, len(self._scripts) - 1)]
        self._calls += 1
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        return ScriptedStream(self, script, list(prompt_ids), params)


class ScriptedStream:
    """One script's steps as a ``TokenStream``; the final step carries the stats."""

    def __init__(
        self, source: ScriptedTokenSource, script: Script, prompt: list[int], params: SamplingParams
    ) -> None:
        self._source = source
        self._cancelling = False
        self._steps = self._run(script, prompt, params)

    def __aiter__(self) -> ScriptedStream:
        return self

    async def __anext__(self) -> Step:
        return await anext(self._steps)

    def cancel(self) -> None:
        """End with a "cancelled" step before the next token."""
        self._cancelling = True

    async def aclose(self) -> None:
        await self._steps.aclose()

    def _logprob(
        self, script: Script, i: int, token: int, params: SamplingParams
    ) -> TokenIdLogprob:
        given = script.logprobs
        value = given[i] if given is not None and i < len(given) else -0.25
        alts = [a for a in script.alternatives if a != token][: max(params.top_logprobs - 1, 0)]
        top = [(token, value), *((a, value - 1.0 - k) for k, a in enumerate(alts))]
        processed = None
        if params.processed_logprobs:
            processed = value if script.processed_logprobs is None else script.processed_logprobs[i]
        return TokenIdLogprob(token, value, tuple(top[: params.top_logprobs]), processed=processed)

    async def _run(
        self, script: Script, prompt: list[int], params: SamplingParams
    ) -> AsyncGenerator[Step, None]:
        stats = GenerationStats(
            prompt_tokens=len(prompt), cached_tokens=min(script.cached_tokens, len(prompt))
        )
        stops = set(self._source.eos_token_ids) | set(params.stop_token_ids)
        finished = False
        constraint = params.constraint() if params.constraint is not None else None
        closing = BudgetClosing(constraint, params.max_tokens) if constraint is not None else None
        script_tokens = list(script.token_ids)
        banned = {t: b for t, b in (params.logit_bias or {}).items() if b <= BAN}
        try:
            i = 0
            while True:
                if self._cancelling:
                    finished = True  # stopped before its end: counted here, not at closing
                    self._source.cancelled += 1
                    yield Step((), finish_reason="cancelled", stats=stats)
                    return
                mask = _mask(constraint, closing) if constraint is not None else None
                if closing is not None and closing.hopeless:  # not even the shortest fits
                    finished = True
                    yield Step((), finish_reason="length", closed=True, stats=stats)
                    return
                # once the closing replaced the script, it writes on to the end
                forced = closing.forcing if closing is not None and closing.closed_early else None
                failing = script.error is not None and i >= script.error_after
                if forced is None and (i >= len(script_tokens) or failing):
                    break
                token = forced if forced is not None else script_tokens[i]
                if forced is None and token in banned:
                    finished = True
                    error = f"logit_bias bans token {token} ({banned[token]})"
                    yield Step((), finish_reason="error", error=error, stats=stats)
                    return
                if mask is not None and not _bit(mask, token):
                    finished = True
                    error = f"the grammar refuses token {token}"
                    yield Step((), finish_reason="error", error=error, stats=stats)
                    return
                if closing is not None:
                    token = closing.admit(token)
                await asyncio.sleep(script.delay)
                stats = dataclasses.replace(
                    stats,
                    output_tokens=stats.output_tokens + 1,
                    first_token_time=stats.first_token_time or time.perf_counter(),
                )
                lp = (self._logprob(script, i, token, params),) if params.logprobs else None
                i += 1
                if constraint is not None and closing is not None:
                    constraint.accept(token)
                    closing.accept(token)
                closed = closing is not None and closing.closed_early
                if token in stops:
                    finished = True
                    reason: FinishReason = "length" if closed else "stop"
                    yield Step((token,), lp, reason, closed=closed, stats=stats)
                    return
                if stats.output_tokens >= params.max_tokens:
                    finished = True
                    yield Step((token,), lp, finish_reason="length", closed=closed, stats=stats)
                    return
                yield Step((token,), lp, closed=closed)
            finished = True
            if script.error is not None:
                if script.raise_error:
                    raise RuntimeError(script.error)
                yield Step((), finish_reason="error", error=script.error, stats=stats)
            else:
                yield Step((), finish_reason=script.finish, stats=stats)
        finally:
            if not finished:
                self._source.cancelled += 1


def _mask(constraint: TokenConstraint, closing: BudgetClosing | None) -> np.ndarray:
    """The next token's mask as the engine computes it (and the closing's look ahead)."""
    mask = np.zeros((constraint.vocab_size + 31) // 32, dtype=np.int32)
    constraint.fill_mask(mask)
    if closing is not None:
        closing.check()
    return mask


def _bit(mask: np.ndarray, token: int) -> bool:
    if not 0 <= token < mask.size * 32:
        return False
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)
