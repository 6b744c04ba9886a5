"""The seam between the protocol and a model family: the protocols every family implements.

A ``Family`` is what differs between a chat-template model (SmolLM2, Qwen, ...) and a
gpt-oss model speaking harmony: which requests it can honour (``check``), how a conversation
becomes prompt ids and stop ids (``render``), and how generated tokens become protocol events
(the ``OutputReader`` a rendered prompt makes for one response). The service only talks to these
protocols, so it holds no branch per model family. ``registry.select_family`` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nbresponses.protocol.events import EventBuilder, TokenLogprob
from nbresponses.protocol.request import CreateRequest
from nbresponses.tokens.contract import ConstraintFactory, TokenIdLogprob


class OutputReader(Protocol):
    """Turns one response's generated tokens into builder calls, across tool rounds."""

    @property
    def reasoning_tokens(self) -> int:
        """Tokens spent reasoning so far (for usage)."""
        ...

    @property
    def replay(self) -> Mapping[str, Any]:
        """Item id -> the item as the model saw it (later turns render that one)."""
        ...

    def feed(self, token_id: int, logprob: TokenIdLogprob | None) -> None:
        """One generated token (with its logprob when the request asked for them)."""
        ...

    @property
    def stop(self) -> bool:
        """Stop generating now (e.g. one function call was asked for and it is complete)."""
        ...

    async def follow_up(self) -> list[int] | None:
        """After a round that stopped normally: run what the model asked a built-in tool for
        and return the ids to append before generating again, or None when the response is
        done."""
        ...

    def finish(self, cut: bool) -> None:
        """The last round is over; ``cut`` when it stopped before the model finished."""
        ...

    async def aclose(self) -> None:
        """Release what the response held (a python sandbox)."""
        ...


# What makes the output reader of one response (``RenderedPrompt.output_reader``).
ReaderFactory = Callable[[EventBuilder], OutputReader]


@dataclass(frozen=True)
class RenderedPrompt:
    """Prompt ids, the ids that end generation, how to read what the model writes, and the
    grammar the output must follow (one fresh constraint per generation; None: free)."""

    ids: list[int]
    stop_token_ids: tuple[int, ...]
    output_reader: ReaderFactory
    constraint: ConstraintFactory | None = None


# An output-reader factory made from a rendered prompt, in place of its own (the Chat
# Completions adapter wraps the family's to count the tokens as they come).
ReaderWrap = Callable[[RenderedPrompt], ReaderFactory]


class Family(Protocol):
    name: str

    def check(self, req: CreateRequest, conversation: Sequence[Any]) -> None:
        """Raise a 400 for anything in the request this kind of model cannot honour."""
        ...

    def render(self, req: CreateRequest, conversation: Sequence[Any]) -> RenderedPrompt:
        """The conversation so far: earlier turns, then the request's input."""
        ...

    # -- text, for scoring given text --------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens added)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids, special tokens included."""
        ...

    def token_logprob(self, logprob: TokenIdLogprob) -> TokenLogprob:
        """An id-based logprob in the protocol's terms (display strings and bytes)."""
        ...
