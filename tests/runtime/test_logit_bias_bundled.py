"""``logit_bias`` on the real bundled model: batch-invariant, and what OpenAI says it does.

Requests with and without a bias, greedy and seeded, run alone on a fresh engine and then all
at once: every step (tokens, raw and processed logprobs, top-k) is the same bits. A +100 bias
makes greedy write the token; -100 on the answer's first token makes the model start otherwise;
the raw logprobs stay the model's own.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from helpers.engine import chat_ids

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams, Step

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTIONS = (
    "What is the capital of France?",
    "Name five fruits.",
    "Hi",
    "Why is the sea salty?",
)


async def _steps(engine: TokenGenerator, prompt: list[int], params: SamplingParams) -> list[Step]:
    return [s async for s in engine.generate(prompt, params)]


async def test_a_bias_is_batch_invariant_on_the_bundled_model(bundled_model, tokenizer):
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    greedy = SamplingParams(max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
    async with TokenGenerator(bundled_model) as engine:
        free = [t for s in await _steps(engine, prompts[0], greedy) for t in s.token_ids]
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    params = [
        dataclasses.replace(greedy, logit_bias={free[0]: -100.0}, processed_logprobs=True),
        greedy,
        dataclasses.replace(
            greedy, temperature=0.9, seed=5, logit_bias={paris: 8.0}, processed_logprobs=True
        ),
        dataclasses.replace(greedy, logit_bias={paris: 100.0}, ignore_eos=True),
    ]
    alone = []
    for prompt, p in zip(prompts, params, strict=True):
        async with TokenGenerator(bundled_model) as engine:  # cold each time: no prefix hit
            alone.append(await _steps(engine, prompt, p))
    async with TokenGenerator(bundled_model) as engine:
        runs = (_steps(engine, prompt, p) for prompt, p in zip(prompts, params, strict=True))
        together = await asyncio.gather(*runs)
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert a == b, f"request {i} differs batched"
    banned = [t for s in alone[0] for t in s.token_ids]
    assert banned[0] != free[0] and free[0] not in banned
    forced = [t for s in alone[3] for t in s.token_ids]
    assert forced == [paris] * 16
    lps = [lp for s in alone[3] for lp in s.logprobs or ()]
    assert lps[0].logprob < -1  # raw: the model's own (" Paris" does not answer this), unbiased
