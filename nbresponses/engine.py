"""``nbr.Engine``: what a user holds — a loaded model plus the Responses API on it.

The runtime (``runtime/``) knows tokens, the service (``service/``) knows the protocol; this
facade is the one place that puts them together, so neither has to import the other.
"""

from __future__ import annotations

import asyncio
import html
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from openai.types.responses import Response

from nbresponses.analysis.analyses import Analyses
from nbresponses.analysis.local import LocalBackend
from nbresponses.models.prepared import PreparedModel
from nbresponses.protocol.request import LOGPROBS_INCLUDE
from nbresponses.runtime import sampling
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.service.database import StorePath
from nbresponses.service.store import STORE_DEFAULTS

if TYPE_CHECKING:
    from nbresponses.server.inprocess import InProcessServer


class Engine(Analyses):
    """A model running in this kernel, served through the OpenAI Responses API, with the
    analyses (``score``, ``choose``, ``divergence``, ``logit_lens``...: ``Analyses``) on it.

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
        client_options.setdefault("store_path", STORE_DEFAULTS.engine_path)
        client_options.setdefault("provenance", _provenance(generator.prepared))
        self._client = AsyncResponsesClient(
            generator,
            generator.tokenizer,
            model=self.model,
            config=self.prepared.config,
            **client_options,
        )
        self.scoring: LocalBackend = LocalBackend(
            generator, self._client.family, model=self.model, store=self._client.store
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
            # here, not at the top: the in-process server brings httpx and the openai SDK's
            # client (~0.16 s measured) that a kernel without engine.openai() never needs
            from nbresponses.server.inprocess import InProcessServer

            self._inprocess = InProcessServer(self._client)
        if sync:
            return self._inprocess.openai(sync=True, **options)
        return self._inprocess.openai(**options)

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

    async def aclose(self) -> None:
        """Stop the decode thread; unfinished requests end as cancelled; the stored responses
        are written out and the store's file closed."""
        if self._inprocess is not None:
            await asyncio.to_thread(self._inprocess.close)
        await self._client.aclose()
        await self.generator.aclose()
        self.scoring.close()

    def close(self) -> Any:
        """Deprecated: ``aclose`` (``close`` is synchronous elsewhere: the clients')."""
        warnings.warn(
            "await engine.close() is now await engine.aclose()", DeprecationWarning, stacklevel=2
        )
        return self.aclose()

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
