"""The seam between the protocol and a model family's token format.

A ``Family`` is what differs between a chat-template model (SmolLM2, Qwen, ...) and a
gpt-oss model speaking harmony: which requests it can honour (``check``), how a conversation
becomes prompt ids and stop ids (``render``), and how generated tokens become protocol events
(the ``Decoder`` a rendered prompt makes for one response). The client and the run loop only
talk to these protocols, so neither holds a branch per model family.

``select_family`` picks the format: "chat", "harmony", a ready ``Family``, or "auto"
(harmony when the model config says ``model_type == "gpt_oss"`` or the tokenizer knows
harmony's ``<|channel|>`` token; a chat template otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from nbresponses.protocol.events import EventBuilder
from nbresponses.protocol.request import CreateRequest
from nbresponses.tokens.contract import TokenIdLogprob, TokenSource

FamilyName = Literal["auto", "chat", "harmony"]
HARMONY_MODEL_TYPES = ("gpt_oss",)
HARMONY_MARKER = "<|channel|>"


class Decoder(Protocol):
    """Turns one response's generated tokens into builder calls, across tool rounds."""

    reasoning_tokens: int
    replay: Mapping[str, Any]  # item id -> the item as the model saw it (for later turns)

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


@dataclass(frozen=True)
class RenderedPrompt:
    """Prompt ids, the ids that end generation, and how to read what the model writes."""

    ids: list[int]
    stop_token_ids: tuple[int, ...]
    decoder: Callable[[EventBuilder], Decoder]


class Family(Protocol):
    name: str

    def check(self, req: CreateRequest, history: Sequence[Any]) -> None:
        """Raise a 400 for anything in the request this kind of model cannot honour."""
        ...

    def render(self, req: CreateRequest, history: Sequence[Any]) -> RenderedPrompt:
        """``history`` is the conversation so far: earlier turns, then the request's input."""
        ...


def _model_type(config: Any) -> str | None:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get("model_type")
    return getattr(config, "model_type", None)


def _knows_harmony(tokenizer: Any) -> bool:
    if tokenizer is None:
        return False
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return False
    return HARMONY_MARKER in vocab


def select_family(
    format: FamilyName | Family,
    *,
    source: TokenSource,
    tokenizer: Any,
    config: Any = None,
    browser: Any = None,
    python_timeout: float = 120.0,
    max_tool_calls: int = 16,
) -> Family:
    """The format for this model (see the module docstring)."""
    if not isinstance(format, str):
        return format
    if format not in ("auto", "chat", "harmony"):
        raise ValueError(f"format must be 'auto', 'chat', 'harmony' or a Family: {format!r}")
    if format == "auto":
        harmony = _model_type(config) in HARMONY_MODEL_TYPES or _knows_harmony(tokenizer)
        format = "harmony" if harmony else "chat"
    if format == "harmony":
        from nbresponses.families.harmony.family import HarmonyFamily

        return HarmonyFamily(
            browser=browser,
            python_timeout=python_timeout,
            max_tool_calls=max_tool_calls,
            eos_token_ids=tuple(source.eos_token_ids),
        )
    if browser is not None:
        raise ValueError("a browser backend needs a gpt-oss (harmony) model")
    if tokenizer is None:
        raise ValueError("a chat-template model needs its tokenizer")
    from nbresponses.families.chat.family import ChatFamily

    return ChatFamily(tokenizer, eos_token_ids=tuple(source.eos_token_ids))
