"""The in-kernel backend: scorings computed on this engine's token source.

Text becomes ids with the model family's tokenizer and chat template (exactly the ids a
generation of the same conversation reads); ids are scored by ``service/scoring.py``'s
``Scorer``, which the Completions endpoint uses too. Only here: the full next-token
distributions (``word_starts``, ``divergence.py``), a Response's own tokens
(``rescore.py``) and the logit lens (``runtime/lens.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from openai.types.responses import Response

from nbresponses.families.base import Family
from nbresponses.protocol.request import parse_create
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.lens import LensResult, LogitLens
from nbresponses.service.scoring import DEFAULT_METHOD, Method, PerPosition, Scorer, Scoring
from nbresponses.service.store import ResponseStore
from nbresponses.tokens.contract import TokenIdLogprob, TokenSource

from .backend import ScoringBackend
from .rescore import generated_ids, prompt_ids
from .word_starts import word_start_logmass, word_start_mask

__all__ = ["LocalBackend"]


class LocalBackend(ScoringBackend):
    """Scores on a token source with a model family's tokenization (``nbr.Engine``'s)."""

    name = "this kernel's engine"

    def __init__(
        self,
        source: TokenSource,
        family: Family,
        *,
        model: str,
        store: ResponseStore | None = None,
    ) -> None:
        self.scorer = Scorer(source, family, model=model)
        self.family = family
        self.store = store  # where a scored Response's prompt is found
        self._lens: LogitLens | None = None  # opened by the first lens()

    @property
    def source(self) -> TokenSource:
        return self.scorer.source

    @property
    def context_length(self) -> int:
        return self.source.context_length

    async def tokenize(self, text: str) -> list[int]:
        return self.family.encode(text)

    def document_start(self) -> int:
        return self.scorer.document_start()

    async def render_chat(self, history: list[Any]) -> list[int]:
        req = parse_create({"input": history}, model=self.scorer.model)
        return list(self.family.render(req, req.input).ids)

    async def score(
        self,
        job: Scoring,
        *,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        word_starts: bool = False,
    ) -> Response:
        per_position = self._word_starts() if word_starts else None
        return await self.scorer.score_tokens(
            job, top_logprobs=top_logprobs, method=method, per_position=per_position
        )

    def _word_starts(self) -> PerPosition:
        """Each position's word-start log-mass, from its full distribution (the mask is made
        once per vocabulary size, at the first position)."""
        masks: dict[int, Any] = {}

        def reduce(distribution: Any) -> float:
            size = len(distribution)
            if size not in masks:
                masks[size] = word_start_mask(self.family, size, self.source.eos_token_ids)
            return word_start_logmass(distribution, masks[size])

        return PerPosition("word_start_logmass", reduce)

    async def distributions(
        self, context: list[int], given: list[int], method: Method = DEFAULT_METHOD
    ) -> list[TokenIdLogprob]:
        return await self.scorer.distributions(context, given, method)

    def token_text(self, logprob: TokenIdLogprob) -> str:
        return self.family.token_logprob(logprob).token

    async def own_tokens(self, response: Response, input: Any = None) -> Scoring:
        ids = generated_ids(self.family, self._vocab_size(), response)
        prompt = prompt_ids(self.family, self.store, response, input=input, model=self.scorer.model)
        return Scoring(prompt, ids)

    def _vocab_size(self) -> int:
        """The ids to map: the model's logits width, else the family tokenizer's length."""
        size = getattr(getattr(self.source, "runner", None), "vocab_size", None)
        if size is None:
            tokenizer = getattr(self.family, "tokenizer", None)
            if tokenizer is None:
                raise ValueError("cannot tell this model's vocabulary size to map tokens to ids")
            size = len(tokenizer)
        return int(size)

    async def lens(self, ids: list[int]) -> tuple[LensResult, dict[int, str]]:
        if not isinstance(self.source, TokenGenerator):
            raise ValueError("the logit lens reads a prepared model's graph (nbr.Engine)")
        if len(ids) > self.context_length:
            raise ValueError(f"{len(ids)} tokens: more than the model's context")
        if self._lens is None:
            runner = self.source.runner
            threads = runner.session.get_session_options().intra_op_num_threads
            self._lens = await asyncio.to_thread(
                LogitLens, self.source.prepared.path, threads=threads
            )
        result = await asyncio.to_thread(self._lens.run, ids)
        vocab = self.source.tokenizer
        names = {t: vocab.decode([t]) for t in {*ids, *result.top_ids.reshape(-1).tolist()}}
        return result, names

    def close(self) -> None:
        """Let the lens graph go (the engine closes the token source)."""
        self._lens = None
