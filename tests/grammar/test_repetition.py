"""The repetition guard on written bytes: what it bans, and what it leaves alone."""

from __future__ import annotations

from nbresponses.grammar.repetition import RepetitionGuard


def guard(gt, text: str, start: str | None = None) -> RepetitionGuard:
    g = RepetitionGuard(
        gt.tokens, gt.with_comma, gt.with_quote, start=start.encode() if start else None
    )
    g.feed(text.encode())
    return g


def texts(gt, ids) -> set[bytes]:
    return {bytes(gt.tokens[i]) for i in ids}


def test_a_list_of_repeated_objects_may_not_grow(grammar_tokenizer):
    gt = grammar_tokenizer
    item = '{"a": "x"}'
    ban = guard(gt, '{"b": [' + ", ".join([item] * 4)).ban()  # three repeats
    banned = texts(gt, ban.banned)
    assert ban.only is None and b"," in banned
    assert b"]" not in banned and b"}" not in banned  # closing stays allowed
    assert all(b"," in t for t in banned)
    # two repeats, or a list of different items: nothing banned
    assert guard(gt, '{"b": [' + ", ".join([item] * 3)).ban().banned == ()
    items = ", ".join(f'{{"a": "{c}"}}' for c in "wxyz")
    assert guard(gt, '{"b": [' + items).ban().banned == ()


def test_inside_an_item_only_tokens_that_would_add_an_item_are_banned(grammar_tokenizer):
    gt = grammar_tokenizer
    ban = guard(gt, '["Mike", "Mike", "Mike", "Mike", "Mi').ban()  # in the fifth item
    banned = texts(gt, ban.banned)
    assert b'",' in banned and b"," not in banned  # "," is text inside the string
    assert b'"' not in banned and b'"]' not in banned


def test_repeated_items_that_are_numbers_never_count(grammar_tokenizer):
    ban = guard(grammar_tokenizer, "[" + ", ".join(["0"] * 20)).ban()
    assert ban.banned == () and ban.only is None


def test_a_looping_string_may_only_close(grammar_tokenizer):
    gt = grammar_tokenizer
    ban = guard(gt, '{"id": "' + "1234567890" * 3).ban()
    assert ban.only is not None and ban.only
    assert all(b'"' in t for t in texts(gt, ban.only))
    # shorter than MIN_BYTES, or the run crossing the string's start: free
    assert guard(gt, '{"id": "' + "ab" * 10).ban().only is None
    assert guard(gt, '{"x": "ab", "y": "ab' + "ab" * 2).ban().only is None


def test_escaped_quotes_do_not_end_a_string(grammar_tokenizer):
    gt = grammar_tokenizer
    g = guard(gt, '["a\\"b", "a\\"b", "a\\"b", "a\\"b"')
    assert g.ban().banned  # four equal items with escapes: three repeats


def test_free_text_before_the_start_is_not_watched(grammar_tokenizer):
    gt = grammar_tokenizer
    loop = '["Mike", "Mike", "Mike", "Mike"'
    assert guard(gt, loop, start="<tool_call>").ban().banned == ()
    assert (
        guard(gt, "free text " + loop + "<tool_call>\n{}", start="<tool_call>").ban().banned == ()
    )
    assert guard(gt, 'free <tool_call>\n{"a": ' + loop, start="<tool_call>").ban().banned
