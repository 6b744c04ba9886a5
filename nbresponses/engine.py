"""``nbr.Engine``: what a user holds — a loaded model plus the Responses API on it.

The engine layer knows tokens, the responses layer knows the protocol; this facade is the one
place that puts them together, so neither has to import the other.
"""

from __future__ import annotations

import asyncio
import html
import os
from typing import TYPE_CHECKING, Any

from nbresponses.models.prepared import PreparedModel
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.client import AsyncResponsesClient

if TYPE_CHECKING:
    from nbresponses.server.inprocess import InProcessServer


class Engine:
    """A model running in this kernel, served through the OpenAI Responses API.

    >>> engine = await nbr.Engine.load()                 # doctest: +SKIP
    >>> client = engine.client()                         # like openai.AsyncOpenAI()
    >>> r = await client.responses.create(input="Hi!")   # an openai Response
    """

    def __init__(self, generator: TokenGenerator, **client_options: Any) -> None:
        self.generator = generator
        self._inprocess: InProcessServer | None = None
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
        store_max_responses: int = 1000,
        store_max_bytes: int = 64 * 2**20,
        **engine_options: Any,
    ) -> Engine:
        """Prepare (once, cached) and load ``model`` — by default the bundled SmolLM2.

        ``quantization`` is a recipe name, ``"auto"`` (the fastest with >= 95% top-1
        agreement with fp32) or ``"analysis"`` (fp32 weights: logprobs for analysis).
        ``engine_options`` go to the token engine (``max_batch_size``,
        ``kv_budget_bytes``, ``prefix_cache_bytes``, ``threads``).
        """
        generator = await TokenGenerator.load(
            model, quantization, cache_dir=cache_dir, progress=progress, **engine_options
        )
        return cls(
            generator,
            store_max_responses=store_max_responses,
            store_max_bytes=store_max_bytes,
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

    async def aclose(self) -> None:
        """Stop the decode thread; unfinished requests end as cancelled."""
        if self._inprocess is not None:
            await asyncio.to_thread(self._inprocess.close)
        await self.generator.aclose()

    close = aclose

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<nbr.Engine {self.prepared.describe()}>"

    def _repr_html_(self) -> str:
        rows = {
            "model": self.model,
            "recipe": self.prepared.recipe,
            "size": f"{self.prepared.size_bytes / 1e6:.0f} MB",
            "fidelity vs fp32": self.prepared.fidelity_summary(),
            "context": f"{self.generator.context_length} tokens",
            "folder": str(self.prepared.path),
        }
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in rows.items()
        )
        return f"<table><caption>nbresponses Engine</caption>{body}</table>"
