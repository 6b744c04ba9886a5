"""A token source that replays a script: drives protocol tests and users' own tests offline.

It honours the parts of the engine contract a consumer can observe: ``max_tokens`` (finish
"length"), end-of-sequence ids and ``stop_token_ids`` (finish "stop"), logprobs only when asked
(with exactly ``top_logprobs`` alternatives), usage counts in ``GenerationStats``, and
cancellation (closing the iterator or cancelling the consuming task stops it). A grammar
(``params.constraint``) is checked as the engine applies it: each scripted token must be one
the mask allows, else the generation ends with finish "error" naming the token (a script is
not a model: it cannot pick another token, so a test sees the grammar refuse it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbresponses.tokens.contract import (
    FinishReason,
    GenerationStats,
    SamplingParams,
    Step,
    TokenConstraint,
    TokenIdLogprob,
)


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

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        stats: GenerationStats | None = None,
    ) -> AsyncIterator[Step]:
        script = self._scripts[min(self._calls, len(self._scripts) - 1)]
        self._calls += 1
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        return self._run(script, list(prompt_ids), params, stats or GenerationStats())

    def _logprob(
        self, script: Script, i: int, token: int, params: SamplingParams
    ) -> TokenIdLogprob:
        value = script.logprobs[i] if script.logprobs is not None else -0.25
        alts = [a for a in script.alternatives if a != token][: max(params.top_logprobs - 1, 0)]
        top = [(token, value), *((a, value - 1.0 - k) for k, a in enumerate(alts))]
        processed = None
        if params.processed_logprobs:
            processed = value if script.processed_logprobs is None else script.processed_logprobs[i]
        return TokenIdLogprob(token, value, tuple(top[: params.top_logprobs]), processed=processed)

    async def _run(
        self, script: Script, prompt: list[int], params: SamplingParams, stats: GenerationStats
    ) -> AsyncIterator[Step]:
        stats.prompt_tokens = len(prompt)
        stats.cached_tokens = min(script.cached_tokens, len(prompt))
        stops = set(self._eos) | set(params.stop_token_ids)
        finished = False
        constraint = params.constraint() if params.constraint is not None else None
        try:
            for i, token in enumerate(script.token_ids):
                if script.error is not None and i >= script.error_after:
                    break
                if constraint is not None and not _allowed(constraint, token):
                    finished = True
                    yield Step(
                        (), finish_reason="error", error=f"the grammar refuses token {token}"
                    )
                    return
                await asyncio.sleep(script.delay)
                if stats.first_token_time is None:
                    stats.first_token_time = time.perf_counter()
                stats.output_tokens += 1
                lp = (self._logprob(script, i, token, params),) if params.logprobs else None
                if constraint is not None:
                    constraint.accept(token)
                if token in stops:
                    finished = True
                    yield Step((token,), lp, finish_reason="stop")
                    return
                if stats.output_tokens >= params.max_tokens:
                    finished = True
                    yield Step((token,), lp, finish_reason="length")
                    return
                yield Step((token,), lp)
            finished = True
            if script.error is not None:
                if script.raise_error:
                    raise RuntimeError(script.error)
                yield Step((), finish_reason="error", error=script.error)
            else:
                yield Step((), finish_reason=script.finish)
        finally:
            if not finished:
                self.cancelled += 1


def _allowed(constraint: TokenConstraint, token: int) -> bool:
    import numpy as np

    if not 0 <= token < constraint.vocab_size:
        return False
    mask = np.zeros((constraint.vocab_size + 31) // 32, dtype=np.int32)
    constraint.fill_mask(mask)
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)
