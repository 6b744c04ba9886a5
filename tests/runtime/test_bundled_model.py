"""The engine on the real bundled SmolLM2-135M-Instruct: PyTorch parity and batch invariance."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers.engine import collect, run_all, tokens, torch_greedy, torch_logprobs

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(max_tokens=32, temperature=0)


@pytest.fixture(scope="module")
def torch_model():
    from transformers import AutoModelForCausalLM

    from nbresponses.models.sources import bundled_gguf_path

    gguf = bundled_gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()


async def test_fp32_greedy_and_logprobs_match_pytorch(bundled_fp32, torch_model, prompts):
    params = SamplingParams(max_tokens=32, temperature=0, logprobs=True, top_logprobs=3)
    async with TokenGenerator(bundled_fp32) as engine:
        eos = engine.eos_token_ids[0]
        for prompt in prompts:
            steps, _ = await collect(engine, prompt, params)
            got = tokens(steps)
            assert got == torch_greedy(torch_model, prompt, 32, eos)
            reference = torch_logprobs(torch_model, prompt, got)
            ours = np.array([s.logprobs[0].logprob for s in steps])
            np.testing.assert_allclose(ours, reference[np.arange(len(got)), got], atol=1e-3)


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of rows whose greedy tokens are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


async def _alone_and_batched(prepared, prompts, **options):
    async with TokenGenerator(prepared, **options) as engine:
        alone = [tokens((await collect(engine, p, GREEDY))[0]) for p in prompts]
        batched = await run_all(engine, prompts * 2, GREEDY)
        staggered = []
        for i, p in enumerate(prompts):  # each joins a batch that is already decoding
            staggered.append(asyncio.create_task(collect(engine, p, GREEDY)))
            await asyncio.sleep(0.02 * i)
        staggered = [tokens(s) for s, _ in await asyncio.gather(*staggered)]
    return alone, batched, staggered


async def test_fp32_batched_equals_alone(bundled_fp32, prompts):
    alone, batched, staggered = await _alone_and_batched(bundled_fp32, prompts)
    assert batched == alone * 2
    assert staggered == alone


async def test_default_recipe_batched_equals_alone(bundled_model, prompts):
    """8-bit weights, int8 activations per block: batched and staggered rows equal the row
    alone token for token (tests/runtime/test_determinism_bundled.py checks the logprobs too).
    The prefix cache is off here to measure batching alone."""
    alone, batched, staggered = await _alone_and_batched(
        bundled_model, prompts, prefix_cache_bytes=0
    )
    assert batched == alone * 2
    assert staggered == alone


@pytest.mark.parametrize("method", ["decode", "prefill"])
async def test_scoring_on_fp32_matches_pytorch(bundled_fp32, bundled_analysis, torch_model, method):
    """Scorings of a given text on fp32 weights (the Optimum export and the analysis recipe)
    agree with PyTorch's log-softmax within 1e-4 per token."""
    from nbresponses.engine import Engine

    text = (
        "The Seine flows through Paris and into the English Channel at Le Havre. Its basin "
        "covers much of northern France, and the river was a trade route for centuries."
    )
    for prepared in (bundled_fp32, bundled_analysis):
        async with Engine(TokenGenerator(prepared)) as engine:
            job = await engine.scoring.prepare(text)
            scoring = await engine.scoring.score(job, method=method)
            ours = np.array([lp.logprob for lp in scoring.output[0].content[0].logprobs])
        reference = torch_logprobs(torch_model, job.prompt, job.given)
        want = reference[np.arange(len(job.given)), job.given]
        assert len(ours) == len(job.given) > 30
        np.testing.assert_allclose(ours, want, atol=1e-4, err_msg=f"{prepared.recipe} {method}")
