"""The engine's two kinds of request on one prefill routine, and the stats each gives by value
on its final step (and on no other)."""

from __future__ import annotations

import pytest
from helpers.engine import PROMPTS, chat_ids

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams


@pytest.fixture(scope="module")
def tiny_fused_fp32(tiny_source, cache_dir):
    from nbresponses.models.prepare import prepare_model

    return prepare_model(tiny_source, "fused-fp32", cache_dir=cache_dir, progress=False)


@pytest.fixture(params=["fp32", "fused-fp32"])
async def generator(request, tiny_model, tokenizer):
    prepared = tiny_model if request.param == "fp32" else request.getfixturevalue("tiny_fused_fp32")
    eng = TokenGenerator(prepared, tokenizer=tokenizer)
    yield eng
    await eng.aclose()


async def test_a_generation_gives_its_stats_on_the_final_step_only(generator, tokenizer):
    prompt = chat_ids(tokenizer, PROMPTS[0])
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    first = [s async for s in generator.generate(prompt, params)]
    again = [s async for s in generator.generate(prompt, params)]
    for steps in (first, again):
        assert [s.stats for s in steps[:-1]] == [None] * (len(steps) - 1)
        stats = steps[-1].stats
        assert steps[-1].finish_reason == "length" and stats is not None
        assert (stats.prompt_tokens, stats.output_tokens) == (len(prompt), 12)
        assert 0 <= stats.queued_s <= stats.total_s and 0 < stats.prefill_s <= stats.total_s
        assert stats.first_token_time is not None
    assert first[-1].stats.cached_tokens == 0
    assert again[-1].stats.cached_tokens > 0  # the prompt's KV, from the prefix cache


async def test_a_scoring_gives_its_stats_on_the_final_step_only(generator, tokenizer):
    tokens = chat_ids(tokenizer, " ".join(PROMPTS))
    stream = generator.score(tokens, start=10, top_logprobs=2)
    steps = [s async for s in stream]
    assert [s.stats for s in steps[:-1]] == [None] * (len(steps) - 1)
    stats = steps[-1].stats
    assert steps[-1].finish_reason == "length" and stats is not None
    assert (stats.prompt_tokens, stats.output_tokens) == (10, len(tokens) - 10)
    assert sum(len(s.token_ids) for s in steps) == len(tokens) - 10
    # nothing is generated: no queue before a prefill of its own, no first token
    assert (stats.queued_s, stats.prefill_s, stats.first_token_time) == (None, None, None)
    assert stats.total_s is not None and stats.total_s > 0


async def test_a_cancelled_generation_gives_its_stats(generator, tokenizer):
    prompt = chat_ids(tokenizer, PROMPTS[1])
    stream = generator.generate(
        prompt, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    )
    received = 0
    async for step in stream:
        received += len(step.token_ids)
        if received >= 3:
            stream.cancel()
        if step.finish_reason is not None:
            break
    assert step.finish_reason == "cancelled" and step.stats is not None
    assert step.stats.prompt_tokens == len(prompt)
    assert received <= step.stats.output_tokens < 200


@pytest.mark.parametrize("cached", [False, True])
async def test_scoring_and_generating_a_prompt_give_the_same_logprobs(generator, tokenizer, cached):
    """The first token of a generation comes from its prompt's prefill; scoring that token after
    the same prompt runs the same prefill routine: the same floats, alternatives and details."""
    prompt = chat_ids(tokenizer, PROMPTS[2])
    if cached:  # a longer conversation with this prefix: both reuse its KV
        _ = [s async for s in generator.score([*prompt, *prompt], start=len(prompt))]
    params = SamplingParams(max_tokens=1, temperature=0, top_logprobs=5, details=True)
    generated = [s async for s in generator.generate(prompt, params)]
    (token,) = generated[0].token_ids
    scored = [s async for s in generator.score([*prompt, token], start=len(prompt), top_logprobs=5)]
    assert scored[-1].token_ids == (token,)
    assert scored[-1].logprobs == generated[0].logprobs
    assert (generated[-1].stats.cached_tokens > 0) == cached
