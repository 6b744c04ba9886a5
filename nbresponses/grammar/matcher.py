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
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

from nbresponses.grammar.closing import ClosingVocab, shortest_closing
from nbresponses.grammar.repetition import Ban, RepetitionGuard

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
    """A tokenizer as llguidance sees it (built once per tokenizer: ~0.4 s), with each token's
    bytes (for the repetition guard) and the special tokens that may end a structure
    (``closers``: harmony's ``<|call|>``, ``<|end|>``, ...; the end token always may), and
    those a closing walk takes only when no byte will do (``openers``: harmony's
    ``<|channel|>``)."""

    def __init__(
        self,
        ll: llguidance.LLTokenizer,
        tokens: Sequence[bytes] = (),
        closers: Sequence[int] = (),
        openers: Sequence[int] = (),
    ) -> None:
        self.ll = ll
        self.tokens = list(tokens)
        self.closers = tuple(closers)
        self.openers = tuple(openers)

    @classmethod
    def from_bytes(
        cls,
        tokens: Sequence[bytes],
        *,
        encode: Any,
        eos_token_id: int,
        special_token_ids: Sequence[int],
        closers: Sequence[int] = (),
        openers: Sequence[int] = (),
    ) -> GrammarTokenizer:
        """From each id's bytes and an encoder of text. (llguidance can also read a Hugging Face
        tokenizer itself, but it misreads the bundled model's GGUF-derived decoder as not
        byte-level: every space would be "Ġ". The families know their tokens' bytes.)"""
        wrapper = llguidance.TokenizerWrapper(
            _Vocab(tokens, encode, eos_token_id, special_token_ids)
        )
        return cls(llguidance.LLTokenizer(wrapper), tokens, closers, openers)

    @property
    def vocab_size(self) -> int:
        return int(self.ll.vocab_size)

    @cached_property
    def by_bytes(self) -> dict[bytes, list[int]]:
        """Plain tokens by their bytes (special tokens left out: they are never text)."""
        special = set(self._special)
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.tokens):
            if b and i not in special:
                out.setdefault(bytes(b), []).append(i)
        return out

    @cached_property
    def _special(self) -> list[int]:
        return [i for i in range(len(self.tokens)) if self.ll.is_special_token(i)]

    @cached_property
    def with_comma(self) -> list[int]:
        """Plain tokens that hold a ``,`` (the ones that can add an item to a list)."""
        return sorted(i for b, ids in self.by_bytes.items() if b"," in b for i in ids)

    @cached_property
    def with_quote(self) -> list[int]:
        """Plain tokens that hold a ``"`` (the ones that can close a string)."""
        return sorted(i for b, ids in self.by_bytes.items() if b'"' in b for i in ids)

    @cached_property
    def closing_vocab(self) -> ClosingVocab:
        return ClosingVocab(self.tokens, self.ll, self.closers, self.openers)


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


@dataclass(frozen=True)
class Guard:
    """The repetition guard's switch and where it starts watching (``grammar/repetition.py``):
    ``after`` is text the output must contain first (a tool-call opener after free text);
    None: from the first token."""

    on: bool = True
    after: str | None = None


class Grammar:
    """A compiled grammar: checked once, then one ``Matcher`` per generation."""

    def __init__(
        self,
        tokenizer: GrammarTokenizer,
        grammar: str,
        guard: Guard = Guard(),
        *,
        whole: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.text = grammar
        self.guard = guard
        # an output cut short is worth nothing (a function call): budget-aware closing holds
        # it to a way to the end at every step, or generates nothing (``tokens/closing.py``)
        self.whole = whole
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, tokenizer.ll
        )
        if is_error:
            raise GrammarError(messages[0] if messages else "the grammar does not compile")

    @classmethod
    def json_schema(
        cls, tokenizer: GrammarTokenizer, schema: dict[str, Any], guard: Guard = Guard()
    ) -> Grammar:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        return cls(tokenizer, grammar, guard)

    @classmethod
    def lark(
        cls, tokenizer: GrammarTokenizer, text: str, guard: Guard = Guard(), *, whole: bool = False
    ) -> Grammar:
        return cls(tokenizer, llguidance.LLMatcher.grammar_from_lark(text), guard, whole=whole)

    def matcher(self) -> Matcher:
        guard = None
        if self.guard.on:
            tok = self.tokenizer
            after = self.guard.after.encode() if self.guard.after is not None else None
            guard = RepetitionGuard(tok.tokens, tok.with_comma, tok.with_quote, start=after)
        return Matcher(self.tokenizer, self.text, guard, whole=self.whole)

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

    def __init__(
        self,
        tokenizer: GrammarTokenizer,
        grammar: str,
        guard: RepetitionGuard | None = None,
        *,
        whole: bool = False,
    ) -> None:
        self.whole = whole  # read by budget-aware closing (``tokens/closing.py``)
        self._m = llguidance.LLMatcher(tokenizer.ll, grammar, log_level=0)
        self._tokenizer = tokenizer
        self._vocab = tokenizer.vocab_size
        self._guard = guard
        self.tokens: list[int] = []
        self.guarded = 0  # steps at which the repetition guard banned a continuation

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def fill_mask(self, mask: np.ndarray) -> None:
        assert mask.dtype == np.int32 and mask.flags["C_CONTIGUOUS"]
        self._m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if self._guard is not None:
            self._apply(mask.view(np.uint32), self._guard.ban())

    def _apply(self, view: np.ndarray, ban: Ban) -> None:
        """Narrow the mask as the guard asks, unless that would leave no token allowed."""
        if ban.only is None and not ban.banned:
            return
        ids = np.asarray(ban.only if ban.only is not None else ban.banned, dtype=np.int64)
        ids = ids[ids < self._vocab]
        chosen = np.zeros_like(view)
        np.bitwise_or.at(chosen, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
        narrowed = view & chosen if ban.only is not None else view & ~chosen
        if narrowed.any() and not np.array_equal(narrowed, view):
            view[:] = narrowed
            self.guarded += 1

    def accept(self, token_id: int) -> None:
        self.tokens.append(token_id)
        self._m.consume_token(token_id)
        if self._guard is not None and token_id < len(self._tokenizer.tokens):
            self._guard.feed(self._tokenizer.tokens[token_id])

    def closing(self, limit: int, after: int | None = None) -> list[int] | None:
        """The tokens that end the grammar from here (after ``after``), the end token included
        (one token when it may end now); None if no way was found within ``limit`` steps."""
        matcher = self._m
        if after is not None:
            matcher = matcher.deep_copy()
            if not matcher.consume_token(after) or matcher.is_error():
                return None
        return shortest_closing(matcher, self._tokenizer.closing_vocab, limit)

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None
