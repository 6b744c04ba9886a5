"""Token text for every family: incremental detokenization and each token's exact bytes."""

from __future__ import annotations

import pytest

from nbresponses.families.text import IncrementalDetokenizer, TokenBytes

SAMPLES = [
    "Hello, world!",
    "Answer é 日本語 🙂 done",
    "<think>hmm, 🤔 let me see</think>\n\nThe answer is 42.",
    'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
]


@pytest.mark.parametrize("s", SAMPLES)
def test_detokenizer_whole_characters(tokenizer, s):
    ids = tokenizer.encode(s)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(t) for t in ids]
    assert detok.flush() == ""
    assert "".join(deltas) == s
    assert all("\ufffd" not in d for d in deltas)
    if "日" in s:
        assert "" in deltas  # a character spanning tokens waits for its last byte


@pytest.mark.parametrize("s", SAMPLES)
def test_token_bytes_join_to_text(tokenizer, s):
    tb = TokenBytes(tokenizer)
    raw = b"".join(bytes(tb.get(t)[1]) for t in tokenizer.encode(s))
    assert raw.decode("utf-8") == s


def test_token_string_of_partial_character(tokenizer):
    tb = TokenBytes(tokenizer)
    partial = [tb.get(t) for t in tokenizer.encode("日")]
    assert len(partial) > 1
    assert all(token.startswith("bytes:\\x") for token, _ in partial)
