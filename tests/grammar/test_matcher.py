"""Compiled grammars on a tiny byte-level tokenizer (one token a byte, and an end token), in
milliseconds: the mask allows what the schema allows next and nothing else, in the fixed JSON
layout; a refused token is an error; the closing walk finds the short way to the end."""

from __future__ import annotations

import numpy as np
import pytest

from nbresponses.grammar import Grammar, GrammarError, GrammarTokenizer, Guard

END = 256
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "tag": {"type": "string", "enum": ["a", "bc"]}},
    "required": ["x", "tag"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def bytes_tokenizer() -> GrammarTokenizer:
    return GrammarTokenizer.from_bytes(
        [bytes([i]) for i in range(256)] + [b""],
        encode=lambda text: list(text.encode() if isinstance(text, str) else text),
        eos_token_id=END,
        special_token_ids=[END],
    )


def allowed(matcher) -> set[bytes | str]:
    mask = np.zeros((matcher.vocab_size + 31) // 32, np.int32)
    matcher.fill_mask(mask)
    ids = [i for i in range(matcher.vocab_size) if int(mask[i // 32]) >> (i % 32) & 1]
    return {"end" if i == END else bytes([i]) for i in ids}


def feed(matcher, text: str) -> None:
    for byte in text.encode():
        matcher.accept(byte)


def test_the_mask_follows_the_schema_in_its_fixed_layout(bytes_tokenizer):
    matcher = Grammar.json_schema(bytes_tokenizer, POINT, Guard(on=False)).matcher()
    assert allowed(matcher) == {b"{"}
    feed(matcher, '{"x')  # the key names are forced, in order
    assert allowed(matcher) == {b'"'}
    feed(matcher, '": ')  # ": " exactly: the layout the prompt shows
    assert allowed(matcher) == {b"-", *(bytes([d]) for d in b"0123456789")}
    feed(matcher, '-12, "tag": "')
    assert allowed(matcher) == {b"a", b"b"}  # the enum's first letters
    feed(matcher, 'bc"}')
    assert allowed(matcher) == {"end"} and matcher.error is None
    assert matcher.tokens == list(b'{"x": -12, "tag": "bc"}')


def test_a_token_the_mask_refuses_is_an_error(bytes_tokenizer):
    matcher = Grammar.json_schema(bytes_tokenizer, POINT, Guard(on=False)).matcher()
    feed(matcher, '{"x": ')
    matcher.accept(ord("a"))
    assert matcher.error is not None


def test_the_closing_is_the_short_way_to_the_end(bytes_tokenizer):
    matcher = Grammar.json_schema(bytes_tokenizer, POINT, Guard(on=False)).matcher()
    way = matcher.closing(64)
    assert way is not None and way[-1] == END
    assert bytes(way[:-1]) == b'{"x": 0, "tag": "a"}'  # the shortest values, the enum's first
    feed(matcher, '{"x": 7')
    assert bytes(matcher.closing(64)[:-1]) == b', "tag": "a"}'
    after = matcher.closing(64, after=ord("1"))  # as if "1" came next; the matcher is untouched
    assert bytes(after[:-1]) == b', "tag": "a"}' and matcher.tokens == list(b'{"x": 7')
    assert matcher.closing(64, after=ord("x")) is None  # a token the grammar refuses


def test_a_lark_grammar_that_does_not_compile_is_refused(bytes_tokenizer):
    with pytest.raises(GrammarError):
        Grammar.lark(bytes_tokenizer, "start: missing_rule\n")
    free = Grammar.lark(bytes_tokenizer, 'start: "yes" | "no"\n').matcher()
    assert allowed(free) == {b"y", b"n"}
