"""Budget-aware closing on the scripted source: a looping structured answer that the budget
would cut off ends as a parseable, schema-valid object, the budget's last token its end."""

from __future__ import annotations

import json

import jsonschema
import pytest

from nbresponses.grammar import Grammar, Guard
from nbresponses.tokens.contract import SamplingParams
from nbresponses.tokens.scripted import ScriptedTokenSource

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "owner": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "mail": {"type": ["string", "null"]}},
            "required": ["id", "mail"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "tags", "owner"],
    "additionalProperties": False,
}
LOOP = '{"name": "Sam", "tags": [' + ", ".join(['"finance"'] * 60)  # never ends


@pytest.fixture(scope="module")
def eos(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


async def run(tokenizer, gt, eos, script, max_tokens):
    grammar = Grammar.json_schema(gt, SCHEMA, Guard(on=False))  # the script is the model
    source = ScriptedTokenSource([script], eos_token_ids=[eos])
    params = SamplingParams(max_tokens=max_tokens, constraint=grammar)
    steps = [s async for s in source.generate([1], params)]
    tokens = [t for s in steps for t in s.token_ids]
    return tokens, steps[-1].finish_reason


async def test_every_budget_that_leaves_room_ends_with_a_valid_object(
    tokenizer, grammar_tokenizer, eos
):
    script = tokenizer.encode(LOOP, add_special_tokens=False)
    shortest = None
    for budget in range(1, 90):
        tokens, finish = await run(tokenizer, grammar_tokenizer, eos, script, budget)
        assert len(tokens) <= budget
        if tokens[-1] != eos:  # too little room from the start: cut off, as without closing
            assert shortest is None and finish == "length"
            continue
        shortest = shortest or budget
        text = tokenizer.decode(tokens[:-1])
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
        assert finish == "length"  # the budget shaped the end
        # the script's own tokens come first, unchanged, then a short way to the end
        common = next(
            (i for i, (a, b) in enumerate(zip(tokens, script, strict=False)) if a != b), budget
        )
        assert len(tokens) - common <= shortest  # never longer than the way from the start
    assert shortest is not None and shortest <= 24  # {"name": "", "tags": [], "owner": ...}


async def test_an_answer_that_ends_within_the_budget_is_left_alone(
    tokenizer, grammar_tokenizer, eos
):
    answer = '{"name": "Sam", "tags": ["a", "b"], "owner": {"id": 7, "mail": null}}'
    script = [*tokenizer.encode(answer, add_special_tokens=False), eos]
    for budget in (len(script) + 16, 400):  # room beyond the shortest way to the end
        tokens, finish = await run(tokenizer, grammar_tokenizer, eos, script, budget)
        assert tokens == script and finish == "stop"


async def test_free_text_is_never_closed(tokenizer, grammar_tokenizer, eos):
    """A grammar that may end at any point (text, or a call) leaves a cut answer as it is."""
    grammar = Grammar.lark(grammar_tokenizer, 'start: TEXT | "{" "}"\nTEXT: /[a-z ]+/\n')
    script = tokenizer.encode("just some words going on and on", add_special_tokens=False)
    source = ScriptedTokenSource([script], eos_token_ids=[eos])
    steps = [
        s async for s in source.generate([1], SamplingParams(max_tokens=4, constraint=grammar))
    ]
    assert [t for s in steps for t in s.token_ids] == script[:4]
    assert steps[-1].finish_reason == "length"


async def test_a_whole_output_is_complete_or_not_started(tokenizer, grammar_tokenizer, eos):
    """``whole`` (a function call's arguments): every choice keeps a way to the end within the
    budget, so each budget gives a schema-valid object or, when not even the shortest one fits,
    nothing at all (never the cut prefix a plain grammar leaves)."""
    grammar = Grammar.json_schema(grammar_tokenizer, SCHEMA, Guard(on=False))
    whole = Grammar(grammar_tokenizer, grammar.text, Guard(on=False), whole=True)
    script = tokenizer.encode(LOOP, add_special_tokens=False)
    shortest = None
    for budget in range(1, 60):
        source = ScriptedTokenSource([script], eos_token_ids=[eos])
        params = SamplingParams(max_tokens=budget, constraint=whole)
        steps = [s async for s in source.generate([1], params)]
        tokens = [t for s in steps for t in s.token_ids]
        assert steps[-1].finish_reason == "length" and steps[-1].closed
        if not tokens:
            assert shortest is None  # too little room from the start: nothing
            continue
        shortest = shortest or budget
        assert tokens[-1] == eos and len(tokens) <= budget
        jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), SCHEMA)
    assert shortest is not None and shortest <= 24
