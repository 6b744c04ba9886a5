"""Scoring on a server: the same scorings as ``engine.score``, computed where the model runs.

Any server that returns prompt logprobs through the Completions API will do: ``nbresponses
serve`` and vLLM. ``RemoteBackend`` tokenizes through the server's ``/tokenize`` (vLLM's
route, which ``nbresponses serve`` serves too), so the ids scored are the ones that server's
model reads, then posts the ids with ``echo=True, max_tokens=0`` and vLLM's
``prompt_logprobs`` and builds the Response-shaped scoring the frames read. vLLM sends each
token's rank and no entropy; ``nbresponses serve`` sends both; a server that only answers
OpenAI's ``echo`` + ``logprobs`` gives logprobs and alternatives, and the frames leave rank and
entropy empty.

What is scored is decided once for every backend (``ScoringBackend.prepare``): plain text after
one start token (the end-of-text token the local engine uses; ``document_start``), or a
continuation after its prompt (an empty prompt is that start token alone). Chat conversations
need the server's chat template, which the Completions API does not expose; ``word_starts=True``
and the divergence need every token's probability, which no Completions server sends: they
stay in the kernel (``nbr.Engine``).
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import openai
from openai.types import CompletionChoice
from openai.types.responses import Response
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob

from nbresponses.service.scoring import (
    DEFAULT_METHOD,
    Method,
    Scoring,
    check_method,
    given_logprob,
    scoring_response,
    windows,
)

from .analyses import Analyses
from .backend import ScoringBackend


def token_bytes(token: str) -> list[int]:
    """A token string's bytes; OpenAI writes part of a character as ``bytes:\\xe6\\x97``."""
    if token.startswith("bytes:"):
        try:
            return list(token[len("bytes:") :].encode("latin-1").decode("unicode_escape").encode(
                "latin-1"
            ))  # fmt: skip
        except (UnicodeError, ValueError):
            pass
    return list(token.encode("utf-8", "surrogatepass"))


class RemoteBackend(ScoringBackend):
    """Scores on a Completions server (``base_url`` ends in ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        document_start: int | None = None,
        timeout: float = 600.0,
        max_retries: int = 2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        root = self.base_url.removesuffix("/v1")
        self._model = model
        self._document_start = document_start
        self.openai = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key or "nbresponses-remote",
            timeout=timeout,
            max_retries=max_retries,
        )
        self._root = root
        self._context_length: int | None = None
        self._lock = asyncio.Lock()

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"the server at {self.host}"

    @property
    def model(self) -> str | None:
        """The model asked for: the one given, else the server's first once it was asked."""
        return self._model

    @property
    def context_length(self) -> int:
        if self._context_length is None:
            raise ValueError(f"{self.name} did not say its context length (vLLM's /tokenize)")
        return self._context_length

    async def resolve_model(self) -> str:
        """The model asked for: the one given, else the server's first (``/v1/models``)."""
        if self._model is None:
            async with self._lock:
                if self._model is None:
                    page = await self.openai.models.list()
                    if not page.data:
                        raise ValueError(f"{self.base_url} serves no model")
                    self._model = page.data[0].id
        return self._model

    async def tokenize(self, text: str) -> list[int]:
        """The server's ids for ``text``, no special tokens added (vLLM's ``/tokenize``)."""
        body = {"model": await self.resolve_model(), "prompt": text, "add_special_tokens": False}
        # through the SDK (its key, retries and error classes); the route is at the root
        data = await self.openai.post(self._root + "/tokenize", body=body, cast_to=dict)
        if isinstance(data.get("max_model_len"), int):
            self._context_length = data["max_model_len"]
        return [int(t) for t in data["tokens"]]

    def document_start(self) -> int:
        if self._document_start is None:
            raise ValueError(
                "scoring plain text (or after an empty prompt) needs a start token to predict "
                "the first token from: give document_start= (the model's end-of-text id; what "
                "the local engine uses), or score a (prompt, continuation) pair"
            )
        return self._document_start

    async def render_chat(self, history: list[Any]) -> list[int]:
        raise ValueError(
            "remote scoring reads plain text: a conversation needs the server's chat "
            "template, which the Completions API does not expose (render it to text)"
        )

    async def score(
        self,
        job: Scoring,
        *,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        word_starts: bool = False,
    ) -> Response:
        """A scoring of ``job.given`` after ``job.prompt``, as ``engine.score`` makes it;
        ``method="decode"`` goes to ``nbresponses serve`` as ``score_method`` (prefill, the
        default, is what every Completions server computes prompt logprobs with)."""
        check_method(method)
        if word_starts:
            raise ValueError(
                "word_starts=True needs each position's full distribution, which the "
                "Completions API does not send: score in the kernel (nbr.Engine)"
            )
        if not job.given:
            raise ValueError("nothing to score: the text has no tokens")
        started = time.time()
        entries: list[Logprob] = []
        cached = 0
        context = self._context_length or len(job.prompt) + len(job.given) + 1
        for prompt, given in windows(job, context):
            got, hit = await self._score_window(prompt, given, top_logprobs, method)
            entries += got
            cached += hit
        metadata = {"nbresponses.method": method, "nbresponses.server": self.host}
        return scoring_response(
            await self.resolve_model(),
            bytes(b for e in entries for b in e.bytes or ()).decode("utf-8", "replace"),
            entries,
            prompt_tokens=len(job.prompt),
            cached_tokens=cached,
            metadata=metadata,
            started=started,
        )

    async def _score_window(
        self, prompt: list[int], given: list[int], top: int, method: Method
    ) -> tuple[list[Logprob], int]:
        extra: dict[str, Any] = {"prompt_logprobs": top}
        if method != DEFAULT_METHOD:
            extra["score_method"] = method
        completion = await self.openai.completions.create(
            model=await self.resolve_model(),
            prompt=[*prompt, *given],
            max_tokens=0,
            echo=True,
            logprobs=top,
            temperature=0,
            extra_body=extra,
        )
        choice = completion.choices[0]
        start = len(prompt)
        ids = [*prompt, *given]
        positions = (choice.model_extra or {}).get("prompt_logprobs")
        if positions:
            entries = [
                _from_prompt_logprobs(positions[i], ids[i], top) for i in range(start, len(ids))
            ]
        else:
            entries = _from_echo(choice, start, len(ids), top)
        usage = completion.usage
        details = usage.prompt_tokens_details if usage is not None else None
        cached = (details.cached_tokens or 0) if details is not None else 0
        return entries, cached

    async def aclose(self) -> None:
        await self.openai.close()


def _from_prompt_logprobs(position: Mapping[str, Any] | None, token_id: int, k: int) -> Logprob:
    """vLLM's ``{token id: {"logprob", "rank", "decoded_token"}}``: the prompt token and the
    top ``k`` (the prompt token counted once when it is among them)."""
    if not position or str(token_id) not in position:
        raise ValueError(f"the server sent no prompt logprob for token {token_id}")
    own = position[str(token_id)]
    others = sorted(
        (v for key, v in position.items() if key != str(token_id)),
        key=lambda v: v.get("rank") or 0,
    )
    if len(others) < k and own.get("rank") is not None:  # the prompt token is one of the top k
        others.insert(min(own["rank"] - 1, len(others)), own)
    top = [
        LogprobTopLogprob(token=_text(v), bytes=token_bytes(_text(v)), logprob=float(v["logprob"]))
        for v in others[:k]
    ]
    token = _text(own)
    return given_logprob(
        token, token_bytes(token), float(own["logprob"]), top, own.get("rank"), own.get("entropy")
    )


def _text(entry: Mapping[str, Any]) -> str:
    token = entry.get("decoded_token")
    return token if isinstance(token, str) else ""


def _from_echo(choice: CompletionChoice, start: int, end: int, k: int) -> list[Logprob]:
    """OpenAI's echo shape: ``tokens`` / ``token_logprobs`` / ``top_logprobs`` (the top ``k``
    plus the token itself); no rank, no entropy."""
    lps = choice.logprobs
    if lps is None or lps.tokens is None or lps.token_logprobs is None:
        raise ValueError("the server sent no logprobs for the prompt (does it support echo?)")
    if len(lps.tokens) < end:
        raise ValueError(f"the server echoed {len(lps.tokens)} of {end} prompt tokens")
    entries = []
    for i in range(start, end):
        token, value = lps.tokens[i], lps.token_logprobs[i]
        if value is None:
            raise ValueError(f"the server sent no logprob for prompt token {i}")
        tops: list[Any] = list(lps.top_logprobs or [])
        alternatives = (tops[i] if i < len(tops) else None) or {}
        ranked = sorted(alternatives.items(), key=lambda kv: -kv[1])
        if len(ranked) > k:  # the token itself, outside the top k
            ranked = [kv for kv in ranked if kv[0] != token][:k]
        top = [LogprobTopLogprob(token=t, bytes=token_bytes(t), logprob=v) for t, v in ranked]
        entries.append(given_logprob(token, token_bytes(token), float(value), top, None, None))
    return entries


class RemoteEngine(Analyses):
    """A model running on a server, with ``Engine``'s analyses and clients.

    ``nbr.RemoteEngine("http://127.0.0.1:8000/v1")`` in place of ``await nbr.Engine.load()``:
    ``score``, ``choose``, ``choose_many``, ``score_many`` and ``score_frame`` (inherited from
    ``Analyses``, as ``Engine``'s are) return the same scorings and frames, computed by
    ``nbresponses serve`` or vLLM; ``client()`` is an ``openai.AsyncOpenAI`` on that server
    (its ``responses`` mirror ``engine.client()``'s). What needs the model in the kernel
    stays on ``Engine``: chat scoring, ``word_starts``, scoring a Response's own tokens,
    ``divergence`` over the full vocabulary and the logit lens (here they say so).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        document_start: int | None = None,
        timeout: float = 600.0,
        max_retries: int = 2,
    ) -> None:
        """``document_start``: the token plain text is scored after (the local engine uses the
        model's end-of-text id); ``model``: by default the server's first."""
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.scoring: RemoteBackend = RemoteBackend(
            self.base_url,
            model=model,
            api_key=api_key,
            document_start=document_start,
            timeout=timeout,
            max_retries=max_retries,
        )

    @property
    def model(self) -> str | None:
        """The model's name on the server: the one given, else the server's first once the
        first request has asked (``await engine.scoring.resolve_model()`` asks now)."""
        return self.scoring.model

    def client(self) -> openai.AsyncOpenAI:
        """The server's API through the openai SDK (``client.responses.create(...)``)."""
        return self.scoring.openai

    def openai(self, *, sync: bool = False, **options: Any) -> openai.AsyncOpenAI | openai.OpenAI:
        """A fresh openai SDK client on the server (``openai.OpenAI`` with ``sync=True``)."""
        options.setdefault("base_url", self.base_url)
        options.setdefault("api_key", self._api_key or "nbresponses-remote")
        return openai.OpenAI(**options) if sync else openai.AsyncOpenAI(**options)

    async def aclose(self) -> None:
        """Close the connection to the server."""
        await self.scoring.aclose()

    def close(self) -> Any:
        """Deprecated: ``aclose`` (``close`` is synchronous elsewhere: the clients')."""
        warnings.warn(
            "await engine.close() is now await engine.aclose()", DeprecationWarning, stacklevel=2
        )
        return self.aclose()

    async def __aenter__(self) -> RemoteEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<nbr.RemoteEngine {self.model or '(first model)'} at {self.base_url}>"
