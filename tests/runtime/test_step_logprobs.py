"""A decode step's rows report their logprobs from one call (``Scheduler._choose_firsts`` ->
``sampling.token_logprobs``, the compiled core on the graph's threads where the model has
one): each row's numbers, ranks, entropies, top k and distribution are still the ones it gets
alone, whatever its batch-mates ask for."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from helpers.engine import PROMPTS, chat_ids

from nbresponses.models import kernels
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime import sampling
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

BASE = SamplingParams(max_tokens=8, temperature=0)
ASKS = [
    dataclasses.replace(BASE, logprobs=True),
    dataclasses.replace(BASE, logprobs=True, top_logprobs=5, details=True),
    dataclasses.replace(BASE, top_logprobs=20, distribution=True),
    BASE,  # no logprobs: a row of the step that asks for none
    dataclasses.replace(
        BASE, temperature=0.8, seed=3, logprobs=True, top_logprobs=2, processed_logprobs=True
    ),
    dataclasses.replace(
        BASE, logprobs=True, logit_bias={1000: 100.0}, processed_logprobs=True, details=True
    ),
]


async def _steps(engine: TokenGenerator, prompt: list[int], params: SamplingParams) -> list:
    return [s async for s in engine.generate(prompt, params)]


def _distributions(steps: list) -> list:
    return [lp.distribution for s in steps for lp in s.logprobs or ()]


@pytest.mark.parametrize("recipe", ["fused-int8-kernel", "fused-fp32"])
async def test_a_steps_rows_get_the_logprobs_each_gets_alone(
    recipe, tiny_source, cache_dir, tokenizer, monkeypatch
):
    if recipe == "fused-int8-kernel":
        try:
            kernels.token_stats()
        except kernels.KernelsUnavailable as error:
            pytest.skip(str(error))
    prepared = prepare_model(tiny_source, recipe, cache_dir=cache_dir, progress=False)
    prompts = [chat_ids(tokenizer, PROMPTS[i % len(PROMPTS)]) for i in range(len(ASKS))]
    async with TokenGenerator(prepared, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        alone = [await _steps(engine, p, q) for p, q in zip(prompts, ASKS, strict=True)]

    calls: list[int] = []  # rows a step's call took
    real = sampling.token_logprobs

    def counted(logits, token_ids, *args, **kwargs):
        calls.append(len(token_ids))
        return real(logits, token_ids, *args, **kwargs)

    monkeypatch.setattr(sampling, "token_logprobs", counted)
    async with TokenGenerator(prepared, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        engine.runner.threads = 2  # the rows shared by two threads, whatever this machine has
        # admitted in one round, so that they decode together however slow the machine (taken
        # as they came, a row could finish its 8 tokens before the last one was admitted)
        with engine.together(len(ASKS)):
            together = await asyncio.gather(
                *(_steps(engine, p, q) for p, q in zip(prompts, ASKS, strict=True))
            )
    assert max(calls) == sum(1 for q in ASKS if q != BASE)  # every reporting row in one call
    assert (engine.runner.token_stats is None) == (recipe == "fused-fp32")
    for mine, theirs, params in zip(together, alone, ASKS, strict=True):
        assert mine == theirs  # tokens, logprobs, top, rank, entropy, processed
        reported = [lp for s in mine for lp in s.logprobs or ()]
        assert len(reported) == (0 if params == BASE else len(mine))
        if params.details:
            assert all(lp.rank is not None and lp.entropy is not None for lp in reported)
        for a, b in zip(_distributions(mine), _distributions(theirs), strict=True):
            if params.distribution:
                np.testing.assert_array_equal(a, b)
            else:
                assert a is None and b is None
    biased = [lp for s in together[-1] for lp in s.logprobs or ()]
    assert all(lp.processed is not None and lp.processed != lp.logprob for lp in biased[:1])
