"""The one scorer interface every analysis is written on: tokenize, prepare, score.

A backend computes scorings somewhere: in this kernel (``local.py``, the engine's token
source) or on a server (``remote.py``, through the Completions API). It says how text becomes
ids (``tokenize``, ``render_chat``, ``document_start``) and scores ids (``score``); what is
scored is decided once, here (``prepare``), so a text scores to the same ids on either.
What only the kernel can give (full distributions, a Response's own tokens, the lens) has a
method here too, which a backend that cannot refuses with a message saying where it can.

What is scored: with ``continuation``, its tokens, after the prompt (raw text, or a chat
prompt ending with the assistant's opening); a conversation ending with an assistant turn
scores that turn; plain text scores every token, after one start token (the end-of-text
token: there is no start-of-text to predict the first token from otherwise;
lm-evaluation-harness does the same). An empty prompt is that start token alone.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from openai.types.responses import Response

from nbresponses.service.scoring import DEFAULT_METHOD, Method, Scoring
from nbresponses.tokens.contract import TokenIdLogprob

__all__ = ["ScoringBackend", "is_responses"]


class ScoringBackend(ABC):
    """Where scorings are computed. ``name`` says where, in the messages of what it refuses."""

    name = "this backend"

    # -- text to ids ---------------------------------------------------------------------------

    @abstractmethod
    async def tokenize(self, text: str) -> list[int]:
        """The model's ids for ``text``, no special tokens added."""

    @abstractmethod
    def document_start(self) -> int:
        """The token plain text (and a continuation of an empty prompt) is scored after."""

    @abstractmethod
    async def render_chat(self, history: list[Any]) -> list[int]:
        """The ids of a chat prompt for ``history``, ending with the assistant's opening."""

    async def prepare(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
    ) -> Scoring:
        """The ids of the context and of the text to score (see the module docstring)."""
        if is_responses(text):
            raise ValueError("a Response is scored on its own tokens: score(response)")
        messages = not isinstance(text, str)
        chat = messages if chat is None else chat
        if messages and not chat:
            raise ValueError("a list of messages is scored with its chat template: chat=True")
        if chat:
            history: list[Any] = (
                [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
            )
            if continuation is None:
                continuation, history = _last_assistant_turn(history)
            return Scoring(await self.render_chat(history), await self.tokenize(continuation))
        assert isinstance(text, str)
        if continuation is None:
            return Scoring([self.document_start()], await self.tokenize(text))
        context, given = await asyncio.gather(self.tokenize(text), self.tokenize(continuation))
        # an empty context is the start token alone (lm-evaluation-harness does the same)
        return Scoring(context or [self.document_start()], given)

    # -- scoring ids ---------------------------------------------------------------------------

    @abstractmethod
    async def score(
        self,
        job: Scoring,
        *,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        word_starts: bool = False,
    ) -> Response:
        """A scoring Response of ``job.given`` after ``job.prompt`` (``word_starts``: each
        entry's ``word_start_logmass``, ``analysis/word_starts.py``)."""

    async def score_text(
        self,
        text: str | Sequence[Any],
        continuation: str | None = None,
        *,
        chat: bool | None = None,
        top_logprobs: int = 0,
        method: Method = DEFAULT_METHOD,
        word_starts: bool = False,
    ) -> Response:
        """``prepare`` then ``score``: what ``engine.score(text, ...)`` returns."""
        job = await self.prepare(text, continuation, chat=chat)
        return await self.score(
            job, top_logprobs=top_logprobs, method=method, word_starts=word_starts
        )

    # -- what only some backends give --------------------------------------------------------

    @property
    def context_length(self) -> int:
        """Tokens the model reads at once (scorings longer than it go in windows)."""
        raise ValueError(f"{self.name} does not say its context length")

    async def distributions(
        self, context: list[int], given: list[int], method: Method = DEFAULT_METHOD
    ) -> list[TokenIdLogprob]:
        """Each given token with its full next-token distribution (``divergence.py``)."""
        raise ValueError(
            f"the full next-token distributions are computed in the kernel, not on {self.name}: "
            "use nbr.Engine"
        )

    async def own_tokens(self, response: Response, input: Any = None) -> Scoring:
        """The ids a generated Response answered and generated (``rescore.py``)."""
        raise ValueError(
            "a Response's own tokens are scored in the kernel (engine.score(response) on "
            "nbr.Engine): they are read back to ids with the engine's vocabulary"
        )

    async def lens(self, ids: list[int]) -> Any:
        """The logit lens of ``ids`` (``runtime/lens.py``'s result) and the token names."""
        raise ValueError(
            f"the logit lens reads the model's layers in the kernel, not on {self.name}"
        )

    def token_text(self, logprob: TokenIdLogprob) -> str:
        """A scored token's text (the rows of ``divergence.py``)."""
        raise ValueError(f"{self.name} cannot name token ids")


def is_responses(obj: Any) -> bool:
    """A Response, or a non-empty list of them (a list of messages is something else)."""
    if isinstance(obj, Response):
        return True
    return isinstance(obj, list) and bool(obj) and all(isinstance(r, Response) for r in obj)


def _last_assistant_turn(history: list[Any]) -> tuple[str, list[Any]]:
    """A conversation ending with an assistant turn: that turn's text and what came before."""
    last = history[-1] if history else {}
    role = last.get("role") if isinstance(last, dict) else getattr(last, "role", None)
    if role != "assistant":
        raise ValueError(
            "nothing to score: give a continuation, or end the conversation with an assistant turn"
        )
    content = last.get("content") if isinstance(last, dict) else last.content
    if not isinstance(content, str):
        raise ValueError("the scored assistant turn must be plain text")
    return content, history[:-1]
