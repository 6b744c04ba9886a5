"""Engine mechanics on the tiny random Llama: PyTorch parity, batching, cancellation, errors."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from helpers.engine import (
    PROMPTS,
    chat_ids,
    collect,
    run_all,
    settle,
    tokens,
    torch_greedy,
    torch_logprobs,
)

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams, TokenSource

GREEDY = SamplingParams(max_tokens=24, temperature=0)


@pytest.fixture(scope="module")
def torch_tiny(tiny_source):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()


@pytest.fixture
async def generator(tiny_model, tokenizer):
    eng = TokenGenerator(tiny_model, tokenizer=tokenizer)
    yield eng
    await eng.aclose()


@pytest.fixture(scope="module")
def references(torch_tiny, prompts, tokenizer):
    return [torch_greedy(torch_tiny, p, GREEDY.max_tokens, tokenizer.eos_token_id) for p in prompts]


async def test_is_a_token_source(generator):
    assert isinstance(generator, TokenSource)
    assert generator.context_length == 512
    assert list(generator.eos_token_ids) == [generator.tokenizer.eos_token_id]


@pytest.mark.slow
async def test_greedy_and_logprobs_match_pytorch(generator, torch_tiny, prompts, references):
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=True, top_logprobs=5)
    for prompt, expected in zip(prompts, references, strict=True):
        steps, stats = await collect(generator, prompt, params)
        got = tokens(steps)
        assert got == expected
        assert stats.prompt_tokens == len(prompt) and stats.output_tokens == len(got)
        reference = torch_logprobs(torch_tiny, prompt, got)
        for i, step in enumerate(steps):
            (lp,) = step.logprobs
            assert lp.token_id == got[i]
            assert abs(lp.logprob - reference[i, got[i]]) < 1e-3
            best = np.argsort(-reference[i], kind="stable")[:5]
            assert [t for t, _ in lp.top] == best.tolist()
            np.testing.assert_allclose([v for _, v in lp.top], reference[i, best], atol=1e-3)
        assert steps[-1].finish_reason in ("length", "stop")


async def test_no_logprobs_unless_asked(generator, prompts):
    steps, _ = await collect(generator, prompts[0], SamplingParams(max_tokens=3, temperature=0))
    assert all(s.logprobs is None for s in steps)
    steps, _ = await collect(generator, prompts[0], SamplingParams(max_tokens=3, logprobs=True))
    assert all(len(s.logprobs) == 1 and s.logprobs[0].top == () for s in steps)


async def test_batched_equals_alone(generator, prompts, references):
    """Prompts of different lengths decode together (left padding) exactly as alone."""
    assert await run_all(generator, prompts * 3, GREEDY) == references * 3


async def test_join_and_leave_mid_batch(generator, prompts, references):
    """Requests arriving while others decode join the running batch; short ones leave early."""
    long = SamplingParams(max_tokens=60, temperature=0)
    first = asyncio.create_task(collect(generator, prompts[4], long))
    while generator.decode_steps < 5:
        await asyncio.sleep(0.001)
    short = [SamplingParams(max_tokens=n, temperature=0) for n in (3, 24, 7)]
    joined = await asyncio.gather(
        *(collect(generator, prompts[i], p) for i, p in zip((0, 1, 2), short, strict=True))
    )
    assert not first.done()  # they really ran inside the long request's batch
    for (steps, _), i, p in zip(joined, (0, 1, 2), short, strict=True):
        assert tokens(steps) == references[i][: p.max_tokens]
    steps, _ = await first
    alone, _ = await collect(generator, prompts[4], long)
    assert tokens(steps) == tokens(alone)
    await settle(generator)
    assert generator.running == 0


async def test_seeded_sampling_is_reproducible(generator, prompts):
    params = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    alone, _ = await collect(generator, prompts[1], params)
    others = SamplingParams(max_tokens=20, temperature=1.0, seed=7)
    batched = await asyncio.gather(
        collect(generator, prompts[0], others),
        collect(generator, prompts[1], params),
        collect(generator, prompts[2], others),
    )
    assert tokens(batched[1][0]) == tokens(alone)
    other_seed, _ = await collect(generator, prompts[1], SamplingParams(max_tokens=20, seed=99))
    unseeded = [
        tokens((await collect(generator, prompts[1], SamplingParams(max_tokens=20)))[0])
        for _ in range(2)
    ]
    assert tokens(other_seed) != tokens(alone) or unseeded[0] != unseeded[1]


@pytest.mark.slow
async def test_cancel_half_of_32_concurrent(generator, prompts, references):
    params = SamplingParams(max_tokens=24, temperature=0)
    streams = [generator.generate(prompts[i % len(prompts)], params) for i in range(32)]

    async def consume(stream, cancel_after: int | None, explicit: bool):
        got = []
        async for step in stream:
            got += step.token_ids
            if cancel_after is not None and len(got) >= cancel_after:
                if explicit:
                    generator.cancel(stream)
                else:
                    raise asyncio.CancelledError
        return got, step.finish_reason

    tasks = []
    for i, stream in enumerate(streams):
        cancel_after = 2 + i % 5 if i % 2 else None
        tasks.append(asyncio.create_task(consume(stream, cancel_after, explicit=i % 4 == 1)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for i, result in enumerate(results):
        expected = references[i % len(prompts)]
        if i % 2 == 0:
            assert result == (expected, "length" if len(expected) == 24 else "stop")
        elif i % 4 == 1:
            got, reason = result
            assert reason == "cancelled" and got == expected[: len(got)]
        else:
            assert isinstance(result, asyncio.CancelledError)
    await settle(generator)
    assert generator.running == 0 and generator.waiting == 0
    assert await run_all(generator, prompts, GREEDY) == references  # still usable


async def test_break_out_of_stream_frees_the_row(generator, prompts):
    async for _step in generator.generate(
        prompts[0], SamplingParams(max_tokens=400, temperature=0)
    ):
        break
    await settle(generator)
    assert generator.running == 0


async def test_invalid_requests_raise_before_admission(generator, prompts):
    with pytest.raises(ValueError, match="context length"):
        generator.generate(list(range(3, 600)), GREEDY)
    with pytest.raises(ValueError, match="empty"):
        generator.generate([], GREEDY)
    with pytest.raises(ValueError, match="vocabulary"):
        generator.generate([10**7], GREEDY)
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_logprobs=21), dict(max_tokens=0)):
        with pytest.raises(ValueError):
            generator.generate(prompts[0], SamplingParams(**bad))
    steps, _ = await collect(generator, prompts[0], SamplingParams(max_tokens=2, temperature=0))
    assert len(tokens(steps)) == 2


async def test_runtime_error_fails_one_request_only(generator, prompts, references, monkeypatch):
    run = generator.runner.run
    poison = prompts[3]

    def flaky(ids, mask, positions, *args, **kwargs):
        begin, end = int(positions[0, 0]), int(positions[0, -1]) + 1
        if ids.shape[1] > 1 and ids[0, : len(poison) - begin].tolist() == poison[begin:end]:
            raise RuntimeError("injected failure")  # a prefill run of prompts[3] only
        return run(ids, mask, positions, *args, **kwargs)

    monkeypatch.setattr(generator.runner, "run", flaky)
    results = await asyncio.gather(*(collect(generator, p, GREEDY) for p in prompts))
    for i, (steps, _) in enumerate(results):
        if i == 3:
            assert steps[-1].finish_reason == "error" and "injected" in steps[-1].error
        else:
            assert tokens(steps) == references[i]


async def test_an_engine_fault_ends_the_running_rows_and_the_engine_goes_on(
    generator, prompts, references
):
    """A bug outside a model run (here: in dropping a finished row from the batch) ends the
    rows it caught with an error; the decode thread lives on, so later requests still run
    (it used to die, and every request, running or to come, waited forever)."""
    kv = generator._scheduler.kv
    remove = kv.remove

    def broken(indices):
        if kv.size >= 2:  # the short request leaving while the long one runs
            raise RuntimeError("injected fault")
        return remove(indices)

    kv.remove = broken  # once: the batch is re-made after the fault
    running = asyncio.Event()

    async def long_one():
        params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
        steps = []
        async for step in generator.generate(prompts[1], params):
            steps.append(step)
            running.set()
        return steps

    async def short_one():
        await running.wait()  # joins the long one's batch
        return await collect(generator, prompts[0], SamplingParams(max_tokens=3, temperature=0))

    long, (short, _) = await asyncio.wait_for(asyncio.gather(long_one(), short_one()), 120)
    assert tokens(short) == references[0][:3] and short[-1].finish_reason == "length"
    assert long[-1].finish_reason == "error" and "injected fault" in long[-1].error
    assert len(tokens(long)) < 400
    steps, _ = await asyncio.wait_for(collect(generator, prompts[2], GREEDY), 120)
    assert tokens(steps) == references[2]


async def test_stop_tokens_max_tokens_and_context_length(generator, prompts, references):
    expected = references[0]
    stop = expected[3]
    steps, _ = await collect(
        generator, prompts[0], SamplingParams(max_tokens=24, temperature=0, stop_token_ids=(stop,))
    )
    first = expected.index(stop)
    assert tokens(steps) == expected[: first + 1] and steps[-1].finish_reason == "stop"
    steps, _ = await collect(generator, prompts[0], SamplingParams(max_tokens=5, temperature=0))
    assert len(tokens(steps)) == 5 and steps[-1].finish_reason == "length"
    long_prompt = (prompts[0] * 40)[:509]
    steps, stats = await collect(
        generator, long_prompt, SamplingParams(max_tokens=50, temperature=0)
    )
    assert stats.prompt_tokens + stats.output_tokens == 512
    assert steps[-1].finish_reason == "length"


async def test_prefix_reuse_for_multi_turn(tiny_model, tokenizer, prompts):
    """A follow-up turn reuses the first prompt's KV at once, and the first answer's too once
    the engine has been idle (it re-computes finished answers by prefill); both give exactly
    the tokens and logprobs of a cold run."""
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    async with TokenGenerator(tiny_model, tokenizer=tokenizer) as eng:
        first, stats1 = await collect(eng, prompts[0], params)
        assert stats1.cached_tokens == 0
        follow = prompts[0] + tokens(first) + chat_ids(tokenizer, "And of Spain?")
        at_once, stats2 = await collect(eng, follow, params)
        # the prompt at least; the answer too if the idle worker already re-computed it (a
        # prefill of an odd count starts one cached token earlier)
        assert len(prompts[0]) - 1 <= stats2.cached_tokens <= len(prompts[0]) + len(first)
        await eng.wait_idle()
        later, stats3 = await collect(eng, follow, params)
        assert stats3.cached_tokens >= len(follow) - 2  # the whole conversation but a token or two
        cache = eng.stats()["prefix_cache"]
        assert (cache["prompts"], cache["hits"]) == (3, 2)
        assert cache["prompt_tokens"] == len(prompts[0]) + 2 * len(follow)
        assert cache["reused_tokens"] == stats2.cached_tokens + stats3.cached_tokens
        assert cache["entries"] >= 1 and 0 < cache["bytes"] <= cache["budget_bytes"]
        assert cache["hit_rate"] == 2 / 3
    async with TokenGenerator(tiny_model, tokenizer=tokenizer, prefix_cache_bytes=0) as cold:
        fresh, stats4 = await collect(cold, follow, params)
        assert stats4.cached_tokens == 0
        cache = cold.stats()["prefix_cache"]
        assert (cache["prompts"], cache["hits"], cache["bytes"], cache["entries"]) == (1, 0, 0, 0)
    assert at_once == fresh and later == fresh  # every token id and logprob, bit for bit


async def test_prefix_cache_is_bounded(tiny_model, tokenizer, prompts):
    bytes_per_token = None
    async with TokenGenerator(tiny_model, tokenizer=tokenizer) as eng:
        bytes_per_token = eng.runner.layout.bytes_per_token
    budget = bytes_per_token * 60
    params = SamplingParams(max_tokens=4, temperature=0)
    async with TokenGenerator(tiny_model, tokenizer=tokenizer, prefix_cache_bytes=budget) as eng:
        for prompt in prompts:
            await collect(eng, prompt, params)
            assert eng.prefix_cache.nbytes <= budget
        assert len(eng.prefix_cache) >= 1


async def test_kv_budget_limits_the_batch_fifo(tiny_model, tokenizer, prompts, references):
    """Requests join in arrival order as the budget frees (equal prompts: no reordering by
    length within a round; no prefix cache, so none is cheaper than another)."""
    async with TokenGenerator(tiny_model, tokenizer=tokenizer) as probe:
        per_token = probe.runner.layout.bytes_per_token
    prompts, references = [prompts[0]] * 3, [references[0]] * 3
    longest = max(len(p) for p in prompts) + GREEDY.max_tokens
    async with TokenGenerator(
        tiny_model,
        tokenizer=tokenizer,
        kv_budget_bytes=2 * longest * per_token,
        prefix_cache_bytes=0,
    ) as eng:
        seen = []

        async def watch():
            while True:
                seen.append(eng.running)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        before = time.perf_counter()
        with eng.together(6):  # queued at once, made within ``spread`` seconds of each other
            streams = [eng.generate(p, GREEDY) for p in prompts * 2]
        spread = time.perf_counter() - before

        async def read(stream):
            return [step async for step in stream]

        results = await asyncio.gather(*(read(stream) for stream in streams))
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        assert [tokens(steps) for steps in results] == references * 2
        assert max(seen) <= 2
        stats = [steps[-1].stats for steps in results]
        assert all(s is not None for s in stats)
        admitted = [s.first_token_time for s in stats]
        assert admitted == sorted(admitted)  # FIFO admission
        # From the worker's own times (seconds since each request came): when each request's
        # prefill began, no more than one earlier request was surely still running.
        for i, late in enumerate(stats):
            running = [s for s in stats[:i] if s.total_s > late.queued_s + spread]
            assert len(running) <= 1, (i, spread, stats)


async def test_a_round_prefills_short_prompts_first(tiny_model, tokenizer, prompts):
    """Requests waiting together are all admitted in one round, the shortest prefilled first:
    its first token comes before the long prompt's, which had arrived first."""
    long = chat_ids(tokenizer, " ".join(PROMPTS * 4))
    short = prompts[0]
    assert len(long) > 3 * len(short)
    async with TokenGenerator(tiny_model, tokenizer=tokenizer, prefix_cache_bytes=0) as eng:
        busy = eng.generate(short, SamplingParams(max_tokens=64, temperature=0))
        await busy.__anext__()  # the worker is decoding: the next two wait together
        with eng.together(2):  # both queued before the worker looks again
            streams = [eng.generate(p, GREEDY) for p in (long, short)]
        stats = []
        for stream in streams:
            steps = [s async for s in stream]
            stats.append(steps[-1].stats)
        async for _ in busy:
            pass
    assert stats[1].first_token_time < stats[0].first_token_time


@pytest.mark.slow
async def test_max_batch_size(tiny_model, tokenizer, prompts, references):
    async with TokenGenerator(tiny_model, tokenizer=tokenizer, max_batch_size=3) as eng:
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, eng.running)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        got = await run_all(eng, prompts * 2, GREEDY)
        watcher.cancel()
        assert got == references * 2 and 1 < peak <= 3


async def test_close_ends_running_requests(tiny_model, tokenizer, prompts):
    eng = TokenGenerator(tiny_model, tokenizer=tokenizer)
    stream = eng.generate(prompts[0], SamplingParams(max_tokens=500, temperature=0))
    await stream.__anext__()
    await eng.aclose()
    last = [step async for step in stream][-1]
    assert last.finish_reason == "cancelled"
    with pytest.raises(RuntimeError):
        eng.generate(prompts[0], GREEDY)


async def test_load_prepares_and_serves(tiny_source, cache_dir, prompts, references):
    eng = await TokenGenerator.load(tiny_source, "fp32", cache_dir=cache_dir, progress=False)
    try:
        assert eng.prepared.recipe == "fp32"
        assert await run_all(eng, prompts[:2], GREEDY) == references[:2]
    finally:
        await eng.aclose()


def test_works_under_asyncio_run(tiny_model, tokenizer, prompts, references):
    eng = TokenGenerator(tiny_model, tokenizer=tokenizer)

    async def main():
        try:
            return await run_all(eng, prompts[:2], GREEDY)
        finally:
            await eng.aclose()

    assert asyncio.run(main()) == references[:2]


def test_a_closed_consumer_loop_frees_its_row(tiny_model, tokenizer, prompts, references):
    """Steps cross to each consumer's loop through a mailbox; a loop that is gone (asyncio.run
    returned with its stream unfinished) must cancel the row, not stall the batch."""
    eng = TokenGenerator(tiny_model, tokenizer=tokenizer)
    long = SamplingParams(max_tokens=400, temperature=0)
    kept: list = []

    async def abandon():
        stream = eng.generate(prompts[0], long)
        kept.append(stream)  # alive after the loop closes: only the closed loop can stop it
        await anext(stream)

    try:
        asyncio.run(abandon())
        request = kept[0]._request
        deadline = time.monotonic() + 30
        while not request.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert request.done and request.cancelled and len(request.generated) < 400
        assert eng.running == 0

        async def again():
            return await run_all(eng, prompts[:2], GREEDY)

        assert asyncio.run(again()) == references[:2]  # a new loop, a fresh mailbox
    finally:
        eng.close_sync()


def test_mailbox_coalesces_wakeups_and_keeps_order():
    from nbresponses.runtime.generator import _Mailbox
    from nbresponses.tokens.contract import Step

    loop = asyncio.new_event_loop()
    calls = []
    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: calls.append(a) or original(*a)  # type: ignore[method-assign]
    try:
        box = _Mailbox(loop)
        queues = [asyncio.Queue(), asyncio.Queue()]
        for i in range(3):
            for q in queues:
                box.post(q, Step((i,)))
        assert len(calls) == 1  # six steps, one wake-up
        loop.run_until_complete(asyncio.sleep(0))
        for q in queues:
            assert [q.get_nowait().token_ids for _ in range(3)] == [(0,), (1,), (2,)]
        box.post(queues[0], Step((9,)))
        assert len(calls) == 2  # drained: the next step schedules a new drain
    finally:
        loop.close()
    with pytest.raises(RuntimeError):
        box.post(queues[0], Step((10,)))


def _subnormals_survive() -> bool:
    tiny = np.array([1e-40], np.float32)  # subnormal in float32
    return bool((tiny * np.float32(1.0))[0] != 0) and bool(np.float64(5e-324) * 2.0 != 0)


def test_the_callers_float_state_is_untouched(tiny_fused, tokenizer, prompts):
    """Loading and running the engine leaves the caller's float state alone (ONNX Runtime's
    denormals-as-zero option would set flush-to-zero on the thread that makes the session: the
    user's notebook)."""
    assert _subnormals_survive()
    eng = TokenGenerator(tiny_fused, tokenizer=tokenizer)
    try:
        asyncio.run(run_all(eng, prompts[:2], GREEDY))
    finally:
        eng.close_sync()
    assert _subnormals_survive()


class _EndsAt:
    """A tokenizer whose end-of-sequence token is ``eos``: as if the model ended there."""

    def __init__(self, tokenizer, eos: int) -> None:
        self.tokenizer, self.eos_token_id = tokenizer, eos

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


async def test_ignore_eos_generates_past_the_end_of_sequence(
    generator, tiny_model, tokenizer, prompts
):
    """A fixed-length answer: the model's eos ends nothing, stop_token_ids still stop."""
    answer = tokens((await collect(generator, prompts[0], GREEDY))[0])
    eos = answer[5]
    async with TokenGenerator(tiny_model, tokenizer=_EndsAt(tokenizer, eos)) as generator:
        assert eos in generator.eos_token_ids
        stopped, _ = await collect(generator, prompts[0], GREEDY)
        assert tokens(stopped) == answer[: answer.index(eos) + 1]
        assert stopped[-1].finish_reason == "stop"
        ignoring = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        full, _ = await collect(generator, prompts[0], ignoring)
        assert tokens(full) == answer and full[-1].finish_reason == "length"
        stop = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=(eos,))
        assert tokens((await collect(generator, prompts[0], stop))[0]) == tokens(stopped)
