"""``nbr.Engine``: what a user holds — a loaded model plus the Responses API on it.

The runtime (``runtime/``) knows tokens, the service (``service/``) knows the protocol; this
facade is the one place that puts them together, so neither has to import the other.
"""

from __future__ import annotations

import asyncio
import html
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from openai.types.responses import Response

from nbresponses.models.prepared import PreparedModel
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.database import StorePath
from nbresponses.service.store import STORE_DEFAULTS

if TYPE_CHECKING:
    from nbresponses.runtime.lens import LogitLens
    from nbresponses.server.inprocess import InProcessServer
    from nbresponses.service.scoring import Method, Scorer


class Engine:
    """A model running in this kernel, served through the OpenAI Responses API.

    >>> engine = await nbr.Engine.load()                 # doctest: +SKIP
    >>> client = engine.client()                         # like openai.AsyncOpenAI()
    >>> r = await client.responses.create(input="Hi!")   # an openai Response
    """

    def __init__(self, generator: TokenGenerator, **client_options: Any) -> None:
        """``client_options`` go to ``AsyncResponsesClient``: the store's bounds and place
        (``store_path``: by default the SQLite file in the user's data dir, where a bare
        client keeps this process's memory; ``StoreDefaults`` says why)."""
        self.generator = generator
        self._inprocess: InProcessServer | None = None
        self._lens: LogitLens | None = None  # opened by the first logit_lens()
        client_options.setdefault("store_path", STORE_DEFAULTS.engine_path)
        client_options.setdefault("provenance", _provenance(generator.prepared))
        self._client = AsyncResponsesClient(
            generator,
            generator.tokenizer,
            model=self.model,
            config=self.prepared.config,
            **client_options,
        )

    @classmethod
    async def load(
        cls,
        model: str | os.PathLike[str] | None = None,
        quantization: str | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        store_path: StorePath = STORE_DEFAULTS.engine_path,
        store_max_responses: int = STORE_DEFAULTS.max_responses,
        store_max_bytes: int = STORE_DEFAULTS.max_bytes,
        store_keep_days: float | None = STORE_DEFAULTS.keep_days,
        store_max_disk_bytes: int | None = STORE_DEFAULTS.max_disk_bytes,
        **engine_options: Any,
    ) -> Engine:
        """Prepare (once, cached) and load ``model`` — by default the bundled SmolLM2.

        ``quantization`` is a recipe name, ``"auto"`` (the fastest with >= 95% top-1
        agreement with fp32) or ``"analysis"`` (fp32 weights: logprobs for analysis).
        Stored responses are kept in a SQLite file, ``store_path`` (default:
        ``$NBRESPONSES_STORE``, else ``responses.sqlite3`` in the user's data dir; "memory"
        keeps them in this kernel only, "off" keeps none), for ``store_keep_days`` and up to
        ``store_max_disk_bytes`` (default: no limit); ``store_max_responses`` /
        ``store_max_bytes`` bound the copies held in memory.
        ``engine_options`` go to the token engine (``max_batch_size``,
        ``kv_budget_bytes``, ``prefix_cache_bytes``, ``threads``).
        """
        generator = await TokenGenerator.load(
            model, quantization, cache_dir=cache_dir, progress=progress, **engine_options
        )
        return cls(
            generator,
            store_path=store_path,
            store_max_responses=store_max_responses,
            store_max_bytes=store_max_bytes,
            store_keep_days=store_keep_days,
            store_max_disk_bytes=store_max_disk_bytes,
        )

    @property
    def prepared(self) -> PreparedModel:
        return self.generator.prepared

    @property
    def model(self) -> str:
        """The model name that responses carry (and that ``create(model=...)`` must match)."""
        return self.prepared.name

    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    def client(self) -> AsyncResponsesClient:
        """The Responses API on this engine; ``client.responses`` mirrors the openai SDK's.

        Always the same client, so stored responses and ``previous_response_id`` chains are
        shared by every caller.
        """
        return self._client

    def find(self, response_id: str) -> Response | None:
        """The stored Response with this id (memory, then the store's file), or None: an
        engine is a lookup for the frames, ``nbr.logprobs_frame(id, lookup=engine)``."""
        return self._client.store.find(response_id)

    def openai(self, *, sync: bool = False, **options: Any) -> Any:
        """The real openai SDK on this engine, in process: ``openai.AsyncOpenAI`` (or
        ``openai.OpenAI`` with ``sync=True``) whose requests never leave the kernel.

        Shares ``client()``'s store; streams arrive as they are generated. See
        ``nbresponses.server.inprocess``.
        """
        if self._inprocess is None:
            from nbresponses.server.inprocess import InProcessServer

            self._inprocess = InProcessServer(self._client)
        if sync:
            return self._inprocess.openai(sync=True, **options)
        return self._inprocess.openai(**options)

    # -- logprobs of given text -----------------------------------------------------------------

    def _scorer(self) -> Scorer:
        from nbresponses.service.scoring import Scorer

        return Scorer(self.generator, self._client.family, model=self.model)

    async def score(
        self,
        text: str | Sequence[Any] | Response,
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int | None = None,
        method: Method = "decode",
        word_starts: bool = False,
        input: Any = None,
    ) -> Response | list[Response]:
        """The logprob, exact rank, entropy and ``top_logprobs`` alternatives of every given
        token, as a Response (``nbr.logprobs_frame``, ``nbr.show`` and the analyses read it).

        ``text`` alone: plain text, every token scored. With ``continuation``: the
        continuation's tokens after ``text`` (plain, or a chat prompt with ``chat=True``). A
        list of chat messages ending with an assistant turn: that turn. ``method="decode"``
        (default) computes each token as a generation does, so a generated answer scores to
        the very logprobs it streamed; ``"prefill"`` is faster for long texts and corpora.
        ``word_starts=True`` adds each position's probability of a word-start token, for
        ``nbr.words_frame(..., bow_correction=True)``. See ``nbresponses.service.scoring``.

        A generated ``Response`` (or a list of them): its own tokens, read from its logprobs,
        after the prompt it answered (from this engine's store, or rendered from ``input=``),
        so the rows line up one to one with ``nbr.logprobs_frame(response)``; ``top_logprobs``
        defaults to the response's. See ``nbresponses.service.rescore``.
        """
        if _responses(text):
            return await self._score_responses(
                text, continuation, chat, top_logprobs, method, word_starts, input
            )
        if input is not None:
            raise ValueError("input= goes with scoring a Response's own tokens")
        return await self._scorer().score(
            text,  # type: ignore[arg-type]
            continuation,
            chat=chat,
            top_logprobs=top_logprobs or 0,
            method=method,
            word_starts=word_starts,
        )

    async def _score_responses(
        self,
        responses: Any,
        continuation: str | None,
        chat: bool | None,
        top_logprobs: int | None,
        method: Method,
        word_starts: bool,
        input: Any,
    ) -> Response | list[Response]:
        from nbresponses.service.rescore import score_response

        if continuation is not None or chat is not None or word_starts:
            raise ValueError(
                "a Response is scored on its own tokens and prompt: no continuation, chat or "
                "word_starts"
            )
        scorer, store = self._scorer(), self._client.store
        if isinstance(responses, Response):
            return await score_response(
                scorer, store, responses, input=input, top_logprobs=top_logprobs, method=method
            )
        inputs = [None] * len(responses) if input is None else list(input)
        if len(inputs) != len(responses):
            raise ValueError(f"{len(inputs)} inputs for {len(responses)} responses")
        return list(
            await asyncio.gather(
                *(
                    score_response(
                        scorer, store, r, input=i, top_logprobs=top_logprobs, method=method
                    )
                    for r, i in zip(responses, inputs, strict=True)
                )
            )
        )

    async def choose(
        self,
        prompt: str | Sequence[Any],
        options: Sequence[str],
        *,
        chat: bool | None = None,
        method: Method = "decode",
        unconditional: str | None = None,
    ) -> Any:
        """How likely the model finds each option as the continuation of ``prompt``: a
        DataFrame with the summed logprob and its per-token, per-character and per-byte
        normalisations, each as a probability among the options
        (``nbresponses.frames.choice``: lm-evaluation-harness's definitions). With
        ``unconditional`` (a neutral context such as ``""`` or ``"Answer:"``), also each
        option's logprob after it and the PMI score. The prompt is computed once and shared
        (prefix cache); the options are scored together."""
        from nbresponses.service.choice import choose

        return await choose(
            self._scorer(), prompt, options, chat=chat, method=method, unconditional=unconditional
        )

    async def choose_many(
        self,
        questions: Any,
        *,
        question: str = "question",
        options: str = "options",
        answer: str | None = "answer",
        chat: bool | None = None,
        method: Method = "decode",
        unconditional: str | None = None,
        concurrency: int = 4,
        progress: bool = True,
    ) -> Any:
        """``choose`` over a DataFrame of questions (a prompt column, a column of option lists,
        optionally the answers): one row per (question, option) with every score and
        ``correct``; ``nbr.choice_accuracy`` of it gives the prediction, probability, accuracy
        and Brier score per normalisation. ``concurrency`` questions at a time, with a bar."""
        from nbresponses.service.choice import choose_many

        return await choose_many(
            self._scorer(),
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

    async def compare(
        self,
        other: Engine,
        texts: Iterable[str],
        *,
        names: tuple[str, str] = ("a", "b"),
        method: Method = "prefill",
        chunk: int = 256,
        progress: bool = True,
    ) -> Any:
        """This engine (the base, ``a``) against ``other`` (``b``, e.g. another recipe of the
        same model) on the same tokens of ``texts``: one row per token with the exact
        full-vocabulary KL(a ‖ b), Δp of the token, both ranks and whether the top-1 agrees,
        computed streaming in chunks (never every logit at once), with a progress bar.
        ``nbr.divergence_summary`` of it is llama.cpp's KL-divergence report."""
        from nbresponses.service.divergence import compare_engines

        return await compare_engines(
            self._scorer(),
            other._scorer(),
            texts,
            names=names,
            method=method,
            chunk=chunk,
            progress=progress,
        )

    def score_many(
        self,
        texts: Iterable[Any],
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Method = "decode",
        concurrency: int = 8,
        progress: bool = True,
        word_starts: bool = False,
    ) -> AsyncIterator[Response]:
        """Score many texts (or ``(prompt, continuation)`` pairs) as an async iterator of
        scorings in input order, ``concurrency`` at a time, with a progress bar;
        ``nbr.logprobs_frame(list_of_them)`` makes one frame of them all."""
        return self._scorer().score_many(
            texts,
            chat=chat,
            top_logprobs=top_logprobs,
            method=method,
            concurrency=concurrency,
            progress=progress,
            word_starts=word_starts,
        )

    async def score_frame(self, texts: Sequence[Any], **options: Any) -> Any:
        """``score_many`` into one ``logprobs_frame``, with a ``document`` column (the index of
        each token's text in ``texts``)."""
        return await self._scorer().score_frame(texts, **options)

    # -- many completions of one prompt ---------------------------------------------------------

    async def sample(
        self,
        input: str | Sequence[Any],
        *,
        n: int = 8,
        seed: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_output_tokens: int | None = None,
        logprobs_mode: str = "processed_logprobs",
        top_logprobs: int = 0,
        **create: Any,
    ) -> list[Response]:
        """``n`` completions of one prompt, drawn as one batch that shares the prompt's KV (one
        prefill), each a stored Response with its own seed; ``nbr.samples_frame`` counts them.

        Completion ``i`` is exactly ``client.responses.create(input=..., temperature=...,
        top_p=..., extra_body={"seed": seeds[i]})`` with ``seeds =
        nbresponses.runtime.sampling.derived_seeds(seed, n)`` (its ``seed`` field says so):
        bit for bit the same alone, and the first ``k`` of ``n`` are those of ``n=k``. Without
        a ``seed`` one is drawn from OS entropy. Logprobs are always included (raw and, with
        the default ``logprobs_mode``, processed: the samples frame's sequence logprobs);
        other ``create`` keywords (``instructions``, ``text``, ``tools``, ``metadata``,
        ``extra_body``...) apply to every completion.
        """
        from nbresponses.protocol.request import LOGPROBS_INCLUDE
        from nbresponses.runtime import sampling

        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        for key in ("stream", "background"):
            if key in create:
                raise TypeError(f"sample() takes no {key!r} keyword for create")
        extra = dict(create.pop("extra_body", None) or {})
        if "seed" in extra:
            raise TypeError("give the seed as sample(seed=...): each completion gets its own")
        base = sampling.fresh_seed() if seed is None else seed
        include = list(create.pop("include", None) or [])
        if LOGPROBS_INCLUDE not in include:
            include.append(LOGPROBS_INCLUDE)
        request: dict[str, Any] = {
            "input": input,
            "temperature": temperature,
            "top_p": top_p,
            "include": include,
            "top_logprobs": top_logprobs,
            **create,
        }
        if max_output_tokens is not None:
            request["max_output_tokens"] = max_output_tokens
        if logprobs_mode != "raw_logprobs":
            extra["logprobs_mode"] = logprobs_mode
        responses = self._client.responses
        with self.generator.together(n):
            created = await asyncio.gather(
                *(
                    responses.create(**request, extra_body={**extra, "seed": one})
                    for one in sampling.derived_seeds(base, n)
                )
            )
        return [r for r in created if isinstance(r, Response)]

    # -- the logit lens -------------------------------------------------------------------------

    async def logit_lens(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
    ) -> Any:
        """Where a prediction forms: for every layer (0 = the embeddings .. the model's output)
        and position, the next-token distribution read from that layer's residual stream
        through the model's own final norm and LM head (``nbr.frames.lens_frame`` columns:
        top tokens, the probability and rank of the token that actually comes next, the KL
        divergence from the last layer). ``nbr.frames.lens_heatmap(frame)`` draws it.

        The tokens are those ``score`` would score (``text`` alone: plain text after an
        end-of-text token; with ``continuation`` or ``chat``: as ``score`` takes them). Needs a
        fused recipe (``fused-q8``, ``analysis``); a lens graph is built once beside the model.
        On 8-bit weights it reads what that model computes (docs/concepts/lens.md).
        """
        from nbresponses.frames.lens import lens_frame
        from nbresponses.runtime.lens import LogitLens

        job = self._scorer().prepare(text, continuation, chat=chat)
        ids = [*job.prompt, *job.given]
        if len(ids) > self.generator.context_length:
            raise ValueError(f"{len(ids)} tokens: more than the model's context")
        if self._lens is None:
            path = self.prepared.path
            threads = self.generator.runner.session.get_session_options().intra_op_num_threads
            self._lens = await asyncio.to_thread(LogitLens, path, threads=threads)
        result = await asyncio.to_thread(self._lens.run, ids)
        vocab = self.tokenizer
        names = {t: vocab.decode([t]) for t in {*ids, *result.top_ids.reshape(-1).tolist()}}
        return lens_frame(
            tokens=[names[t] for t in ids],
            top_tokens=np.vectorize(names.__getitem__, otypes=[object])(result.top_ids),
            top_logprobs=result.top_logprobs,
            next_logprob=result.next_logprob,
            next_rank=result.next_rank,
            kl=result.kl,
        )

    async def aclose(self) -> None:
        """Stop the decode thread; unfinished requests end as cancelled; the stored responses
        are written out and the store's file closed."""
        if self._inprocess is not None:
            await asyncio.to_thread(self._inprocess.close)
        await self._client.aclose()
        await self.generator.aclose()
        self._lens = None

    close = aclose

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def stats(self) -> dict[str, Any]:
        """Load and memory now: running and waiting requests, the decoding KV, the prefix
        cache (entries, bytes, hit rate) and the response store (what ``/health`` reports)."""
        return self._client.stats()

    def __repr__(self) -> str:
        return f"<nbr.Engine {self.prepared.describe()}; prefix cache {self._cache_line()}>"

    def _cache_line(self) -> str:
        cache = self.generator.prefix_cache.stats()
        if cache.budget_bytes <= 0:
            return "off (this recipe's numbers would depend on it)"
        entries = "1 entry" if cache.entries == 1 else f"{cache.entries} entries"
        line = f"{cache.bytes / 2**20:.0f} of {cache.budget_bytes / 2**20:.0f} MiB, {entries}"
        if cache.prompts:
            line += (
                f"; {cache.hits} of {cache.prompts} prompts hit, "
                f"{cache.token_reuse:.0%} of prompt tokens reused"
            )
        return line

    def _repr_html_(self) -> str:
        store = self._client.store
        rows = {
            "model": self.model,
            "recipe": self.prepared.recipe,
            "size": f"{self.prepared.size_bytes / 1e6:.0f} MB",
            "fidelity vs fp32": self.prepared.fidelity_summary(),
            "context": f"{self.generator.context_length} tokens",
            "prefix cache": self._cache_line(),
            "stored responses": (
                f"{len(store)} in memory, {store.bytes / 2**20:.1f} of "
                f"{store.max_bytes / 2**20:.0f} MiB"
                + (f"; kept in {store.database.path}" if store.database is not None else "")
            ),
            "folder": str(self.prepared.path),
        }
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in rows.items()
        )
        return f"<table><caption>nbresponses Engine</caption>{body}</table>"


def _responses(obj: Any) -> bool:
    """A Response, or a non-empty list of them (a list of messages is something else)."""
    if isinstance(obj, Response):
        return True
    return isinstance(obj, list) and bool(obj) and all(isinstance(r, Response) for r in obj)


def _provenance(prepared: PreparedModel) -> dict[str, Any]:
    """What each stored response records of the model that made it."""
    manifest = prepared.manifest
    source = manifest.get("source") or {}
    return {
        "model": prepared.name,
        "recipe": prepared.recipe,
        "model_hash": manifest.get("key"),
        "weights_hash": source.get("content_hash"),
        "source": source.get("hub_id") or source.get("kind"),
    }
