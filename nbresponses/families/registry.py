"""Which family a model speaks: "auto" detection, or a name, or a ready ``Family``.

"auto" is harmony when the model config says ``model_type == "gpt_oss"`` or the tokenizer
knows harmony's ``<|channel|>`` token, and the tokenizer's chat template otherwise. Options of
one family (harmony's built-in tools) are given by constructing it: ``HarmonyFamily(...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from nbresponses.families.base import Family
from nbresponses.tokens.contract import Tokenizer, TokenSource

FamilyName = Literal["auto", "chat", "harmony"]
HARMONY_MODEL_TYPES = ("gpt_oss",)
HARMONY_MARKER = "<|channel|>"


def _model_type(config: Any) -> str | None:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get("model_type")
    return getattr(config, "model_type", None)


def _knows_harmony(tokenizer: Tokenizer | None) -> bool:
    if tokenizer is None:
        return False
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return False
    return HARMONY_MARKER in vocab


def select_family(
    family: FamilyName | Family,
    *,
    source: TokenSource,
    tokenizer: Tokenizer | None,
    config: Any = None,
) -> Family:
    """The family for this model (see the module docstring)."""
    if not isinstance(family, str):
        return family
    if family not in ("auto", "chat", "harmony"):
        raise ValueError(f"family must be 'auto', 'chat', 'harmony' or a Family: {family!r}")
    if family == "auto":
        harmony = _model_type(config) in HARMONY_MODEL_TYPES or _knows_harmony(tokenizer)
        family = "harmony" if harmony else "chat"
    # each family is imported when a model asks for it (~0.25 s each, measured): a chat model
    # never loads openai_harmony, a harmony one never the chat template machinery
    if family == "harmony":
        from nbresponses.families.harmony.family import HarmonyFamily

        return HarmonyFamily(eos_token_ids=tuple(source.eos_token_ids))
    if tokenizer is None:
        raise ValueError("a chat-template model needs its tokenizer")
    from nbresponses.families.chat.family import ChatFamily

    return ChatFamily(tokenizer, eos_token_ids=tuple(source.eos_token_ids))
