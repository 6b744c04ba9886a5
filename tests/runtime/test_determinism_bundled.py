"""Exact numbers on the real bundled model, for the default recipe and the analysis recipe.

The engine matrix (``determinism.py``) with prompts of 30 to ~750 tokens (the longest spans two
prefill runs of 512, so prefix hits start inside either), mates of other lengths and a full
batch of 16; then the same request through every door of the Responses API: create, stream,
background + retrieve, the openai SDK in process and over HTTP, and a ``previous_response_id``
chain against the whole conversation sent cold.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from helpers.determinism import run_matrix
from helpers.engine import chat_ids, score_at_once, scored_numbers

from nbresponses.models.fidelity_set import FIDELITY_SET
from nbresponses.tokens.contract import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=24, temperature=0, logprobs=True, top_logprobs=5)
SEEDED = SamplingParams(max_tokens=24, temperature=0.8, seed=11, logprobs=True, top_logprobs=2)
QUESTIONS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string, and explain it.",
    "Name five fruits.",
    "Why is the sea salty? Explain at length, with the chemistry involved.",
    "Hi",
)


def _document() -> str:
    texts = [m["content"] for s in FIDELITY_SET for m in s.messages if m["role"] == "assistant"]
    return "Summarise the following notes in three sentences.\n\n" + "\n\n".join(texts[:11])


# Each case is 75-105 s on an idle 2-core machine (minutes on a loaded one). CI runs the
# diagonal (each recipe, each sampling mode once); the tiny model's matrix crosses every recipe
# with both on every run, and NBRESPONSES_FULL_MATRIX=1 crosses them here too.
_CASES = [("default", "greedy"), ("analysis", "seeded")]
if os.environ.get("NBRESPONSES_FULL_MATRIX") == "1":
    _CASES += [("default", "seeded"), ("analysis", "greedy")]


@pytest.mark.parametrize(("recipe", "sampling"), _CASES, ids=["-".join(c) for c in _CASES])
async def test_matrix_on_the_bundled_model(request, recipe, sampling, tokenizer):
    model = request.getfixturevalue("bundled_model" if recipe == "default" else "bundled_analysis")
    params = GREEDY if sampling == "greedy" else SEEDED
    targets = [chat_ids(tokenizer, QUESTIONS[0]), chat_ids(tokenizer, _document())]
    assert len(targets[1]) > 600, "the long prompt must span two prefill runs"
    mates = [chat_ids(tokenizer, q) for q in QUESTIONS[1:]]
    follow_up = chat_ids(tokenizer, "Thank you. Now say it in French.")[1:]
    failures = await run_matrix(model, tokenizer, targets, mates, params, follow_up)
    assert not failures, "\n".join(failures)


def _numbers(response) -> list[tuple]:
    """Every output token of a Response with its logprob and top-k, as plain tuples."""
    out = []
    for item in response.output:
        for part in getattr(item, "content", None) or []:
            for lp in getattr(part, "logprobs", None) or []:
                top = tuple((t.token, t.logprob) for t in lp.top_logprobs or [])
                out.append((lp.token, lp.logprob, top))
    return out


async def test_every_door_of_the_api_gives_the_same_numbers(bundled_model, tokenizer):
    """create, stream, background + retrieve, engine.openai(), HTTP, a previous_response_id
    chain and a restarted engine: the same tokens and logprob floats, bit for bit."""
    from helpers.server import ThreadedServer

    from nbresponses.engine import Engine
    from nbresponses.runtime.generator import TokenGenerator

    request = {
        "input": "Tell me about the Eiffel Tower.",
        "max_output_tokens": 32,
        "temperature": 0,
        "top_logprobs": 5,
        "include": ["message.output_text.logprobs"],
    }
    follow = "How tall is it?"

    async def cold(**extra):  # a fresh engine, no prefix cache: the reference
        async with Engine(TokenGenerator(bundled_model, prefix_cache_bytes=0)) as engine:
            return await engine.client().responses.create(**{**request, **extra})

    reference = await cold()
    assert len(_numbers(reference)) >= 8
    conversation = [
        {"role": "user", "content": request["input"]},
        {"role": "assistant", "content": reference.output_text},
        {"role": "user", "content": follow},
    ]
    reference_turn = await cold(input=conversation)

    async with Engine(TokenGenerator(bundled_model)) as engine:  # a restarted engine, cache on
        client = engine.client()
        seen = {"create": await client.responses.create(**request)}
        seen["create again (prefix hit)"] = await client.responses.create(**request)
        stream = await client.responses.create(**request, stream=True)
        seen["stream"] = [e async for e in stream][-1].response
        background = await client.responses.create(**request, background=True, store=True)
        while background.status in ("queued", "in_progress"):
            await asyncio.sleep(0.05)
            background = await client.responses.retrieve(background.id)
        seen["background + retrieve"] = background
        seen["engine.openai()"] = await engine.openai().responses.create(**request)
        with ThreadedServer(client) as server:
            seen["HTTP"] = await server.openai().responses.create(**request)
        for name, response in seen.items():
            assert _numbers(response) == _numbers(reference), name
        chained = await client.responses.create(
            **{**request, "input": follow}, previous_response_id=seen["create"].id
        )
        assert _numbers(chained) == _numbers(reference_turn), "previous_response_id"
        await engine.generator.wait_idle()
        chained = await client.responses.create(
            **{**request, "input": follow}, previous_response_id=seen["create"].id
        )
        assert chained.usage.input_tokens_details.cached_tokens > len(_numbers(reference))
        assert _numbers(chained) == _numbers(reference_turn), "chain after the answer is cached"


async def test_texts_scored_together_get_the_numbers_each_gets_alone(bundled_model, tokenizer):
    """Short scoring jobs queued at once run as the rows of one graph run (``together``), on the
    default recipe's own operators: each gets the logprobs, ranks, entropies and alternatives
    it gets alone in a fresh engine, bit for bit, with and without a cached beginning."""
    from nbresponses.runtime.generator import TokenGenerator

    turns = [m["content"] for s in FIDELITY_SET for m in s.messages]
    documents = [
        tokenizer.encode(t)[:n] for t, n in zip(turns, (5, 9, 17, 24, 31, 40, 52, 64), strict=False)
    ]
    question = tokenizer.encode("Question: which planet is the largest? Answer:")
    options = [question + tokenizer.encode(o) for o in (" Jupiter", " Mars", " the Sun")]
    async with TokenGenerator(bundled_model) as generator:
        rows: list[int] = []
        run_steps = generator.runner.run_steps

        def counted(ids, positions, past, keep=0):
            rows.append(ids.shape[0])
            return run_steps(ids, positions, past, keep)

        generator.runner.run_steps = counted
        together = await score_at_once(generator, documents, top_logprobs=5)
        chosen = await score_at_once(generator, options, start=len(question), top_logprobs=5)
    assert max(rows) >= 4  # the short documents shared runs, the options too
    alone = []
    for ids, start in [(d, 1) for d in documents] + [(o, len(question)) for o in options]:
        async with TokenGenerator(bundled_model, prefix_cache_bytes=0) as fresh:
            alone.append([s async for s in fresh.score(ids, start=start, top_logprobs=5)])
    got = [scored_numbers(s) for s in together + chosen]
    assert got == [scored_numbers(s) for s in alone]
