"""The legacy Completions API on the local engine: ``client.completions.create(...)``.

Scoring tools (lm-evaluation-harness's ``local-completions``, vLLM clients) read prompt
logprobs from ``/v1/completions`` with ``echo=True, logprobs=k`` (and ``max_tokens`` 0 or 1),
or from vLLM's ``prompt_logprobs``. Here the prompt's logprobs are the engine's scoring
(``Scorer.logprobs``), the very numbers ``engine.score`` gives on the same ids, computed with
``score_method`` ("prefill" by default: many tokens per run). Generation runs as a Responses
generation does, on the same batched engine; each choice of a request (``n`` per prompt) is its
own generation, so several prompts (lm-eval sends batches) are decoded together, and the ``n``
choices of a prompt are admitted together and share its prefill (``_begin``). The sampling
values are the request core's (``protocol/generation.py``): this module only runs them.

One request failing never touches another: each runs in its own tasks, and a request's
own tasks are cancelled when it fails or its reader leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types import Completion, CompletionChoice

from nbresponses.families.base import Family
from nbresponses.families.text import IncrementalDetokenizer
from nbresponses.protocol import completions as shapes
from nbresponses.protocol.completions import CompletionRequest, FinishReason, TokenEntry
from nbresponses.protocol.errors import bad_request, server_error
from nbresponses.protocol.generation import check_token_ids
from nbresponses.service.scoring import Scorer, Scoring
from nbresponses.service.stream import AsyncStream, Interleaved
from nbresponses.tokens.contract import (
    GenerationStats,
    TokenIdLogprob,
    TokenSource,
    TokenStream,
    stop_early,
)

CONTEXT_IDS = 8  # prompt ids the detokenizer reads before generated text (spacing, characters)


class _FamilyText:
    """The family's ``decode`` as the tokenizer ``IncrementalDetokenizer`` expects."""

    def __init__(self, family: Family) -> None:
        self._family = family

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str:
        return self._family.decode(list(token_ids))


@dataclass
class _Piece:
    """Part of one choice: text, its tokens' entries, and the finish reason on the last."""

    text: str
    entries: list[TokenEntry] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_entries: list[TokenEntry] | None = None  # vLLM's prompt_logprobs, on the first


class _Prompt:
    """One prompt of a request: its ids and, when asked, their logprobs, scored once for all
    of its ``n`` choices."""

    def __init__(self, owner: AsyncCompletions, req: CompletionRequest, ids: list[int]) -> None:
        self.owner = owner
        self.req = req
        self.ids = ids
        self.logprobs: list[TokenIdLogprob | None] = [None] * len(ids)
        self.cached = 0  # prompt tokens the engine reused (scoring or generation)

    async def score(self) -> None:
        """None for the first token (nothing predicts it), then the engine's scoring."""
        req = self.req
        if not req.scores_prompt or len(self.ids) < 2:
            return
        top = max(req.logprobs or 0, req.prompt_logprobs or 0)
        job = Scoring(self.ids[:1], self.ids[1:])
        try:
            scored, cached = await self.owner.scorer.logprobs(
                job, top_logprobs=top, method=req.score_method
            )
        except ValueError as exc:  # ids outside the vocabulary, and the like
            raise bad_request(f"Invalid 'prompt': {exc}.", param="prompt") from None
        self.logprobs = [None, *scored]
        self.cached = max(self.cached, cached)


class _Choice:
    """One choice: its prompt's echo and prompt logprobs (when asked), then its generation,
    as pieces. ``start`` queues the generation; ``pieces`` reads it."""

    def __init__(self, prompt: _Prompt, index: int, seed: int | None) -> None:
        self.owner = prompt.owner
        self.req = prompt.req
        self.prompt = prompt
        self.index = index
        self.seed = seed
        self.steps: TokenStream | None = None
        self.generated = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt.ids

    def start(self) -> None:
        """Queue the generation (none with ``max_tokens=0``): a 400 for what the engine
        refuses before it begins (ids outside the vocabulary)."""
        req = self.req
        if req.max_tokens == 0:
            return
        params = req.sampling.engine_params(
            max_tokens=req.max_tokens,
            logprobs=req.logprobs is not None,
            top_logprobs=req.logprobs or 0,
            ignore_eos=req.ignore_eos,
            seed=self.seed,
        )
        try:
            self.steps = self.owner.source.generate(self.ids, params)
        except ValueError as exc:
            param = "logit_bias" if "logit_bias" in str(exc) else "prompt"
            raise bad_request(f"Invalid '{param}': {exc}.", param=param) from None

    async def close(self) -> None:
        """Stop the generation, if it runs."""
        if self.steps is not None:
            await self.steps.aclose()

    def _entry(self, token_id: int, offset: int, lp: TokenIdLogprob | None) -> TokenEntry:
        family = self.owner.family
        if lp is None:  # the token's string only (the family speaks in logprobs)
            token = family.token_logprob(TokenIdLogprob(token_id, 0.0)).token
            return TokenEntry(id=token_id, token=token, offset=offset)
        given = family.token_logprob(lp)
        return TokenEntry(
            id=token_id,
            token=given.token,
            offset=offset,
            logprob=given,
            top_ids=tuple(t for t, _ in lp.top),
            rank=lp.rank,
            entropy=lp.entropy,
        )

    async def pieces(self) -> AsyncIterator[_Piece]:
        req, family = self.req, self.owner.family
        detok = IncrementalDetokenizer(_FamilyText(family))  # type: ignore[arg-type]
        prompt_lps = self.prompt.logprobs
        first = _Piece("")
        if req.echo:
            for token_id, lp in zip(self.ids, prompt_lps, strict=True):
                first.entries.append(self._entry(token_id, len(detok.text), lp))
                detok.push(token_id)
            first.text = family.decode(self.ids)
            if req.logprobs is None:
                first.entries = []
        else:
            for token_id in self.ids[-CONTEXT_IDS:]:
                detok.push(token_id)
        if req.prompt_logprobs is not None:
            first.prompt_entries = [
                self._entry(t, 0, lp) for t, lp in zip(self.ids, prompt_lps, strict=True)
            ]
        base = len(detok.text) - len(first.text)  # where this choice's text starts in detok's
        if self.steps is None:  # max_tokens=0: the prompt only
            first.finish_reason = "length"
            yield first
            return
        if first.text or first.entries or first.prompt_entries is not None:
            yield first  # (a stream without echo starts with the first generated text)
        async for piece in self._generate(self.steps, detok, base):
            yield piece

    async def _generate(
        self, steps: TokenStream, detok: IncrementalDetokenizer, base: int
    ) -> AsyncIterator[_Piece]:
        req = self.req
        stops = req.stop
        emitted = 0  # characters of generated text already sent
        out = ""
        stats: GenerationStats | None = None  # the final step's
        try:
            async for step in steps:
                if step.finish_reason is not None:
                    stats = step.stats
                piece = _Piece("")
                for j, token_id in enumerate(step.token_ids):
                    self.generated += 1
                    lp = step.logprobs[j] if step.logprobs else None
                    offset = len(detok.text) - base
                    if req.logprobs is not None:
                        piece.entries.append(self._entry(token_id, offset, lp))
                    last = j == len(step.token_ids) - 1
                    if not (last and step.finish_reason == "stop"):  # the eos is not text
                        out += detok.push(token_id)
                    hit = _find_stop(out, stops)
                    if hit is not None:
                        out = out[:hit]
                        piece.finish_reason = "stop"
                        break
                if piece.finish_reason is None and step.finish_reason is not None:
                    if step.finish_reason in ("error", "cancelled"):
                        raise server_error(f"The engine stopped: {step.error or 'cancelled'}.")
                    if step.finish_reason == "length":
                        out += detok.flush()
                    piece.finish_reason = "stop" if step.finish_reason == "stop" else "length"
                end = len(out) if piece.finish_reason else len(out) - _held(out, stops)
                piece.text, emitted = out[emitted:end], max(emitted, end)
                yield piece
                if piece.finish_reason is not None:
                    if step.finish_reason is None:  # a stop sequence ended it first
                        stats = await stop_early(steps)
                    return
        finally:
            if stats is not None:
                self.prompt.cached = max(self.prompt.cached, stats.cached_tokens)
            await steps.aclose()


async def _begin(req: CompletionRequest, prompts: Sequence[_Prompt]) -> list[_Choice]:
    """Score the prompts (when asked; once per prompt), then queue every choice's generation
    at once. With ``n > 1`` they are queued through the engine's admission gate
    (``TokenGenerator.together``), so the ``n`` choices of a prompt are admitted in one round
    and share one prefill; choice ``j`` of a prompt is exactly that prompt sent alone with
    ``seed=req.sampling.choice_seeds(n)[j]`` (``Sampling.choice_seeds``)."""
    await _all([p.score() for p in prompts])
    seeds = req.sampling.choice_seeds(req.n)
    choices = [
        _Choice(prompt, i * req.n + j, seed)
        for i, prompt in enumerate(prompts)
        for j, seed in enumerate(seeds)
    ]
    together = getattr(prompts[0].owner.source, "together", None)
    gate = together(len(choices)) if req.n > 1 and req.max_tokens > 0 and together else None
    try:
        for choice in choices:
            choice.start()
    except BaseException:
        await _close(choices)
        raise
    finally:
        if gate is not None:
            gate.release()
    return choices


async def _all(work: Sequence[Awaitable[None]]) -> None:
    """Await all of ``work`` at once; when one fails (or we are cancelled) the others stop."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.gather(*tasks)
    finally:
        await _cancel([t for t in tasks if not t.done()])


async def _close(choices: Sequence[_Choice]) -> None:
    for choice in choices:
        await choice.close()


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop sequence starts in ``text`` (None: none there)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _held(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that may begin a stop sequence: a stream holds them
    back until the next token says whether the sequence completes."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return held


class CompletionStream(AsyncStream[Completion]):
    """A streamed ``completions.create``: ``Completion`` chunks as OpenAI streams them.

    Each chunk holds one choice's new text (and its tokens' logprobs), with the choice's index
    (prompt ``i``'s choice ``j`` is ``i * n + j``); the last chunk of a choice has its
    ``finish_reason``; with ``stream_options={"include_usage": True}`` a last chunk with no
    choices carries the usage of the request, and with vLLM's ``continuous_usage_stats`` too
    every chunk carries its choice's usage so far (its prompt's tokens, the tokens generated
    so far: vLLM's per-chunk figures). Closing the stream stops the generations.
    """

    def __init__(self, owner: AsyncCompletions, req: CompletionRequest, prompts: list[_Prompt]):
        self._owner = owner
        self._req = req
        self._prompts = prompts
        self._choices: list[_Choice] = []
        self._id, self._created = shapes.new_completion_id()
        self._pieces: Interleaved[_Choice, _Piece] | None = None
        self._iterator = self._chunks()

    async def _chunks(self) -> AsyncIterator[Completion]:
        req, model = self._req, self._owner.model
        self._choices = await _begin(req, self._prompts)
        self._pieces = Interleaved(self._choices, _Choice.pieces)
        async for choice, piece in self._pieces:
            usage = None
            if req.stream_options.usage_on_every_chunk:
                usage = _usage([choice.prompt], [choice])
            yield shapes.completion(
                self._id, self._created, model, [_choice(req, choice, piece)], usage
            )
        if req.stream_options.include_usage:
            usage = _usage(self._prompts, self._choices)
            yield shapes.completion(self._id, self._created, model, [], usage)

    async def cancel(self) -> None:
        """Stop the generations now; the stream ends after the chunks already made."""
        if self._pieces is not None:
            await self._pieces.stop()

    async def close(self) -> None:
        """Stop reading and stop the generations still running."""
        await self._iterator.aclose()  # type: ignore[attr-defined]
        await self.cancel()
        await _close(self._choices)


def _choice(req: CompletionRequest, run: _Choice, piece: _Piece) -> CompletionChoice:
    logprobs = shapes.logprobs(piece.entries, req.logprobs) if req.logprobs is not None else None
    prompt = None
    if piece.prompt_entries is not None:
        prompt = shapes.prompt_logprobs(piece.prompt_entries, req.prompt_logprobs or 0)
    return shapes.choice(
        run.index,
        piece.text,
        finish_reason=piece.finish_reason,
        logprobs=logprobs,
        prompt_logprobs=prompt,
    )


def _usage(prompts: Sequence[_Prompt], choices: Sequence[_Choice]) -> Any:
    """Each prompt's tokens once (however many choices read it, as OpenAI and vLLM count),
    every choice's generated tokens."""
    return shapes.usage(
        sum(len(p.ids) for p in prompts),
        sum(c.generated for c in choices),
        sum(min(p.cached, len(p.ids)) for p in prompts),
    )


async def _cancel(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class AsyncCompletions:
    """``client.completions``: ``create`` as ``openai.AsyncOpenAI().completions.create``."""

    def __init__(self, source: TokenSource, family: Family, *, model: str) -> None:
        self.source = source
        self.family = family
        self.model = model
        self.scorer = Scorer(source, family, model=model)

    def tokenize(self, text: str) -> list[int]:
        """The ids the engine reads for ``text`` (no special tokens added)."""
        return self.family.encode(text)

    def vocab_size(self) -> int | None:
        """Token ids the model has: its logits' width, else its tokenizer's length (None when
        neither is known: the engine checks)."""
        size = getattr(getattr(self.source, "runner", None), "vocab_size", None)
        if size is None:
            tokenizer = getattr(self.family, "tokenizer", None)
            size = len(tokenizer) if tokenizer is not None else None
        return None if size is None else int(size)

    def _ids(self, prompt: str | list[int], where: str, req: CompletionRequest) -> list[int]:
        ids = self.family.encode(prompt) if isinstance(prompt, str) else prompt
        if not ids:
            raise bad_request(f"Invalid '{where}': the prompt has no tokens.", param=where)
        context = self.source.context_length
        asked = len(ids) + max(req.max_tokens, 1)
        if asked > context:
            raise bad_request(
                f"This model's maximum context length is {context} tokens, however you "
                f"requested {len(ids) + req.max_tokens} tokens ({len(ids)} in your prompt; "
                f"{req.max_tokens} for the completion; the prompt takes at most {context - 1})."
                " Please reduce your prompt; or completion length.",
                param=where,
                code="context_length_exceeded",
            )
        return ids

    def _prompts(self, req: CompletionRequest) -> list[_Prompt]:
        many = len(req.prompts) > 1
        return [
            _Prompt(self, req, self._ids(p, f"prompt[{i}]" if many else "prompt", req))
            for i, p in enumerate(req.prompts)
        ]

    async def create(self, **kwargs: Any) -> Completion | CompletionStream:
        """A ``Completion`` (or a ``CompletionStream`` of chunks with ``stream=True``).

        ``n`` choices per prompt share the prompt's prefill; with a ``seed``, choice ``j`` of
        a prompt is exactly the prompt sent alone with
        ``seed=nbresponses.runtime.sampling.derived_seeds(seed, n)[j]`` (``n > 1``)."""
        req = shapes.parse_completion(kwargs, model=self.model)
        check_token_ids(req.sampling.logit_bias, self.vocab_size())
        prompts = self._prompts(req)
        if req.stream:
            return CompletionStream(self, req, prompts)
        completion_id, created = shapes.new_completion_id()
        choices = await _begin(req, prompts)
        tasks = [asyncio.ensure_future(_fold(req, c)) for c in choices]
        try:
            folded = await asyncio.gather(*tasks)
        finally:
            await _cancel([t for t in tasks if not t.done()])  # one failed, or we were cancelled
            await _close(choices)
        return shapes.completion(
            completion_id, created, self.model, folded, _usage(prompts, choices)
        )


async def _fold(req: CompletionRequest, run: _Choice) -> CompletionChoice:
    """A choice's pieces as one choice."""
    text: list[str] = []
    entries: list[TokenEntry] = []
    prompt_entries = None
    finish: FinishReason | None = None
    async for piece in run.pieces():
        text.append(piece.text)
        entries.extend(piece.entries)
        prompt_entries = piece.prompt_entries if prompt_entries is None else prompt_entries
        finish = piece.finish_reason or finish
    return _choice(req, run, _Piece("".join(text), entries, finish, prompt_entries))
