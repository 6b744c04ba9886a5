"""The scripted token source, the tests' model: limits, stop tokens, logprobs, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from nbresponses.tokens.contract import SamplingParams
from nbresponses.tokens.scripted import Script, ScriptedTokenSource


async def collect(source, prompt, params):
    return [s async for s in source.generate(prompt, params)]


async def test_scripted_source_limits_and_logprobs():
    src = ScriptedTokenSource([Script([5, 6, 7, 8], logprobs=[-0.1, -0.2, -0.3, -0.4])])
    steps = await collect(src, [1, 2], SamplingParams(max_tokens=2, logprobs=True, top_logprobs=3))
    assert [s.token_ids for s in steps] == [(5,), (6,)]
    assert steps[-1].finish_reason == "length"
    assert all(len(s.logprobs[0].top) == 3 for s in steps)
    steps = await collect(src, [1], SamplingParams(stop_token_ids=(7,)))
    assert steps[-1].token_ids == (7,) and steps[-1].finish_reason == "stop"
    assert all(s.logprobs is None for s in steps)


async def test_scripted_source_cancellation():
    src = ScriptedTokenSource([Script(list(range(10, 60)), delay=0.01)])

    async def consume():
        async for _ in src.generate([1], SamplingParams(max_tokens=100)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert src.cancelled == 1


async def test_scripted_source_refuses_a_token_the_bias_bans():
    """The script is what was chosen after logit_bias: a banned token cannot have been, so the
    generation ends in an error naming it; other biases leave the script as it is."""
    src = ScriptedTokenSource([Script([5, 6, 7, 8])])
    steps = await collect(src, [1], SamplingParams(logit_bias={7: -100, 5: -99.5, 6: 100}))
    assert [s.token_ids for s in steps] == [(5,), (6,), ()]
    assert steps[-1].finish_reason == "error" and "logit_bias bans token 7" in steps[-1].error
    assert src.params[-1].logit_bias == {7: -100, 5: -99.5, 6: 100}
    steps = await collect(src, [1], SamplingParams(logit_bias={9: -100, 5: 3.0}))
    assert [t for s in steps for t in s.token_ids] == [5, 6, 7, 8]
    assert steps[-1].finish_reason == "stop"
