"""Grammars compiled for one tokenizer, and the per-generation matcher the engine masks with.

The grammar engine is llguidance (Microsoft; behind OpenAI's structured outputs, and used by
vLLM, SGLang and llama.cpp). Compared with xgrammar 0.2.9 on this machine
(``benchmarks/grammar.py``: the bundled SmolLM2 tokenizer, a schema with nested objects,
enums, arrays and strings), both compile in milliseconds and mask in microseconds, far below a
decode step (figures in that file and docs/concepts/structured.md). llguidance is chosen
because (1) it needs nothing but numpy at run time, while xgrammar requires torch, triton and
apache-tvm-ffi, which the ``engine`` install does without; (2) it refuses JSON-schema keywords
it cannot enforce instead of ignoring them, which is what lets a request get a 400 rather than
a silently unconstrained run; (3) its Lark grammars take regex intersection and complement
(free text up to a tool-call opener), name special tokens and embed JSON schemas (``%json``),
which tool calls and harmony need.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

if TYPE_CHECKING:  # a stub-only name
    from llguidance._lib import JsonCompileOptions

# One JSON layout, no free whitespace: ", " and ": " as json.dumps writes them and as the chat
# prompts show calls (a model follows the layout it has seen; free whitespace lets a weak model
# wander into endless newlines).
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# The layout of harmony (gpt-oss): its schemas and call examples are compact JSON.
COMPACT_JSON: JsonCompileOptions = {**JSON_OPTIONS, "item_separator": ",", "key_separator": ":"}


class GrammarError(ValueError):
    """The grammar does not compile (for a JSON schema: a feature llguidance cannot enforce)."""


class GrammarTokenizer:
    """A tokenizer as llguidance sees it (built once per tokenizer: ~0.4 s)."""

    def __init__(self, ll: llguidance.LLTokenizer) -> None:
        self.ll = ll

    @classmethod
    def from_bytes(
        cls,
        tokens: Sequence[bytes],
        *,
        encode: Any,
        eos_token_id: int,
        special_token_ids: Sequence[int],
    ) -> GrammarTokenizer:
        """From each id's bytes and an encoder of text. (llguidance can also read a Hugging Face
        tokenizer itself, but it misreads the bundled model's GGUF-derived decoder as not
        byte-level: every space would be "Ġ". The families know their tokens' bytes.)"""
        wrapper = llguidance.TokenizerWrapper(
            _Vocab(tokens, encode, eos_token_id, special_token_ids)
        )
        return cls(llguidance.LLTokenizer(wrapper))

    @property
    def vocab_size(self) -> int:
        return int(self.ll.vocab_size)


class _Vocab:
    def __init__(
        self, tokens: Sequence[bytes], encode: Any, eos: int, special: Sequence[int]
    ) -> None:
        self.tokens = list(tokens)
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = list(special)
        self._encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._encode(text))


class Grammar:
    """A compiled grammar: checked once, then one ``Matcher`` per generation."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str) -> None:
        self.tokenizer = tokenizer
        self.text = grammar
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, tokenizer.ll
        )
        if is_error:
            raise GrammarError(messages[0] if messages else "the grammar does not compile")

    @classmethod
    def json_schema(cls, tokenizer: GrammarTokenizer, schema: dict[str, Any]) -> Grammar:
        return cls(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS))

    @classmethod
    def lark(cls, tokenizer: GrammarTokenizer, text: str) -> Grammar:
        return cls(tokenizer, llguidance.LLMatcher.grammar_from_lark(text))

    def matcher(self) -> Matcher:
        return Matcher(self.tokenizer, self.text)

    __call__ = matcher  # a ConstraintFactory


def json_lark(schema: dict[str, Any], options: JsonCompileOptions = JSON_OPTIONS) -> str:
    """A Lark rule body that matches one JSON value of ``schema`` in one fixed layout
    (``options``: ``JSON_OPTIONS`` unless a family's model writes another)."""
    body = {**schema, "x-guidance": {**options, **schema.get("x-guidance", {})}}
    return "%json " + json.dumps(body, ensure_ascii=False)


def lark_string(text: str) -> str:
    """A Lark string literal that matches ``text`` exactly."""
    return json.dumps(text, ensure_ascii=False)


class Matcher:
    """One generation's grammar state (a ``TokenConstraint``): masks, then accepts a token."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str) -> None:
        self._m = llguidance.LLMatcher(tokenizer.ll, grammar, log_level=0)
        self._vocab = tokenizer.vocab_size
        self.tokens: list[int] = []

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def fill_mask(self, mask: np.ndarray) -> None:
        assert mask.dtype == np.int32 and mask.flags["C_CONTIGUOUS"]
        self._m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

    def accept(self, token_id: int) -> None:
        self.tokens.append(token_id)
        self._m.consume_token(token_id)

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None

    @property
    def accepting(self) -> bool:
        """The tokens so far are a complete match (the grammar may end here)."""
        return bool(self._m.is_accepting())


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32
