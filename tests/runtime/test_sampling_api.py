"""Seeded sampling through the Responses API, and processed logprobs, on the tiny model.

A seeded sampled request (``extra_body={"seed": ...}``) gives the same tokens and logprob floats
alone, batched with other requests, streamed or not, and through the openai SDK. Processed
logprobs (``logprobs_mode="processed_logprobs"``) are checked against an independent numpy
computation on the model's logits.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers.engine import PROMPTS, chat_ids

from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

LOGPROBS = ["message.output_text.logprobs"]


def _engine(prepared, tokenizer, **options) -> Engine:
    return Engine(TokenGenerator(prepared, tokenizer=tokenizer, **options), store_path="memory")


def numbers(response) -> list[tuple]:
    """Every output token of a Response with its raw and processed logprob and its top-k."""
    out = []
    for item in response.output:
        for part in getattr(item, "content", None) or []:
            for lp in getattr(part, "logprobs", None) or []:
                top = tuple((t.token, t.logprob) for t in lp.top_logprobs or [])
                extra = lp.model_extra or {}
                out.append((lp.token, lp.logprob, extra.get("processed_logprob"), top))
    return out


SEEDED = {
    "input": "Write a haiku about the sea.",
    "max_output_tokens": 24,
    "temperature": 0.9,
    "top_p": 0.95,
    "include": LOGPROBS,
    "top_logprobs": 3,
    "extra_body": {"seed": 1234, "logprobs_mode": "processed_logprobs"},
}


async def test_a_seeded_request_is_the_same_bits_everywhere(tiny_fused, tokenizer):
    async with _engine(tiny_fused, tokenizer, prefix_cache_bytes=0) as cold:
        reference = await cold.client().responses.create(**SEEDED)
    expected = numbers(reference)
    assert len(expected) >= 8 and reference.seed == 1234
    assert any(p != raw for _, raw, p, _ in expected), "temperature and top_p reshape it"

    async with _engine(tiny_fused, tokenizer) as engine:
        client = engine.client()
        seen = {"alone (restarted engine)": await client.responses.create(**SEEDED)}
        seen["again (prefix hit)"] = await client.responses.create(**SEEDED)
        others = [
            {"input": text, "max_output_tokens": 8 + 5 * i, "temperature": 0.7 + 0.1 * i,
             "extra_body": {"seed": i}}
            for i, text in enumerate(PROMPTS[2:5])
        ]  # fmt: skip
        batched = await asyncio.gather(
            *(client.responses.create(**o) for o in others[:2]),
            client.responses.create(**SEEDED),
            client.responses.create(**others[2]),
        )
        seen["batched with 3 others"] = batched[2]
        stream = await client.responses.create(**SEEDED, stream=True)
        seen["streamed"] = [e async for e in stream][-1].response
        streams = await asyncio.gather(
            client.responses.create(**SEEDED, stream=True),
            client.responses.create(**others[0], stream=True),
        )
        seen["streamed, batched"] = [e async for e in streams[0]][-1].response
        async for _ in streams[1]:
            pass
        seen["openai SDK, extra_body"] = await engine.openai().responses.create(**SEEDED)
        for name, response in seen.items():
            assert numbers(response) == expected, name
            assert response.seed == 1234, name
        stored = await client.responses.retrieve(seen["streamed"].id)
        assert stored.seed == 1234 and numbers(stored) == expected

        other_seed = {**SEEDED, "extra_body": {**SEEDED["extra_body"], "seed": -1234}}
        assert numbers(await client.responses.create(**other_seed)) != expected


# -- processed logprobs against numpy ------------------------------------------------------


def _model_logits(engine: TokenGenerator, ids: list[int]) -> np.ndarray:
    """Logits of every position of ``ids`` in one prefill run of the same ONNX model, [len,
    vocab] (a prefill sums in another order than decode steps: equal within ~1e-6)."""
    runner = engine.runner
    logits, _ = runner.run(
        np.array([ids], np.int64),
        np.ones((1, len(ids)), np.int64),
        np.arange(len(ids), dtype=np.int64)[None],
        runner.layout.empty(),
        position=None,
    )
    return np.asarray(logits, np.float64)


def _reference(logits: np.ndarray, token: int, temperature: float, top_p: float) -> float:
    """The processed logprob, computed independently: softmax of logits / temperature, then the
    smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    x = logits / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    kept = order[: int(np.searchsorted(cum, top_p)) + 1]
    if token not in kept:
        return -np.inf
    return float(np.log(p[token] / p[kept].sum()))


async def _generate(prepared, tokenizer, prompt, params, *, logits: bool = False):
    """The steps of one request; with ``logits``, also the model's logits at each of its
    generated positions (an independent run of the model, for references)."""
    async with TokenGenerator(prepared, tokenizer=tokenizer) as engine:
        steps = [s async for s in engine.generate(prompt, params)]
        if not logits:
            return steps
        generated = [t for s in steps for t in s.token_ids]
        return steps, _model_logits(engine, prompt + generated[:-1])[len(prompt) - 1 :]


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.3, 1.0), (0.8, 0.9)])
async def test_processed_logprobs_equal_numpy(tiny_fused, tokenizer, temperature, top_p):
    prompt = chat_ids(tokenizer, PROMPTS[0])
    params = SamplingParams(
        max_tokens=12, temperature=temperature, top_p=top_p, seed=5, logprobs=True,
        processed_logprobs=True, ignore_eos=True,
    )  # fmt: skip
    steps, logits = await _generate(tiny_fused, tokenizer, prompt, params, logits=True)
    generated = [t for s in steps for t in s.token_ids]
    lps = [lp for s in steps for lp in s.logprobs or ()]
    assert len(generated) == 12
    for i, (token, lp) in enumerate(zip(generated, lps, strict=True)):
        raw = logits[i] - logits[i].max()
        raw = raw - np.log(np.exp(raw).sum())
        assert lp.logprob == pytest.approx(raw[token], abs=1e-5), i
        assert lp.processed == pytest.approx(
            _reference(logits[i], token, temperature, top_p), abs=1e-5
        ), i
        assert np.isfinite(lp.processed)  # a drawn token is always in the kept set
    if top_p < 1:  # the nucleus cuts: processed is above what temperature alone gives
        tempered = [_reference(logits[i], t, temperature, 1.0) for i, t in enumerate(generated)]
        assert all(lp.processed >= t - 1e-6 for lp, t in zip(lps, tempered, strict=True))
        assert any(lp.processed > t + 1e-3 for lp, t in zip(lps, tempered, strict=True))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=10, temperature=0, top_p=0.5),  # greedy: the model's own
        SamplingParams(max_tokens=10, temperature=1.0, seed=3),  # nothing reshapes it
    ],
    ids=["greedy", "temperature-1"],
)
async def test_processed_equals_raw_where_nothing_reshapes(tiny_fused, tokenizer, params):
    params = SamplingParams(
        **{**params.__dict__, "logprobs": True, "processed_logprobs": True, "top_logprobs": 2}
    )
    steps = await _generate(tiny_fused, tokenizer, chat_ids(tokenizer, PROMPTS[1]), params)
    lps = [lp for s in steps for lp in s.logprobs or ()]
    assert lps and all(lp.processed == lp.logprob for lp in lps)  # the same float


async def test_processed_logprobs_change_no_token(tiny_fused, tokenizer):
    """Asking for processed logprobs never moves a token or a raw logprob."""
    prompt = chat_ids(tokenizer, PROMPTS[4])
    base = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=8, logprobs=True)
    with_processed = SamplingParams(**{**base.__dict__, "processed_logprobs": True})
    a = await _generate(tiny_fused, tokenizer, prompt, base)
    b = await _generate(tiny_fused, tokenizer, prompt, with_processed)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [lp.logprob for s in a for lp in s.logprobs or ()] == [
        lp.logprob for s in b for lp in s.logprobs or ()
    ]


# -- many completions of one prompt --------------------------------------------------------


SAMPLE = {"temperature": 1.3, "top_p": 0.95, "max_output_tokens": 12, "top_logprobs": 2}


async def test_sample_is_the_seeded_requests_one_by_one(tiny_fused, tokenizer):
    """``sample(n, seed)`` shares one prefill among its completions, and each completion is
    bit for bit the request made alone with its derived seed, on another engine."""
    from nbresponses.frames import samples_frame
    from nbresponses.runtime.sampling import derived_seeds

    question = "Name a colour."
    async with _engine(tiny_fused, tokenizer, prefix_cache_bytes=0) as engine:
        samples = await engine.sample(question, n=6, seed=11, **SAMPLE)
        first_three = await engine.sample(question, n=3, seed=11, **SAMPLE)
    seeds = derived_seeds(11, 6)
    assert [r.seed for r in samples] == seeds and len(set(seeds)) == 6
    assert [numbers(r) for r in first_three] == [numbers(r) for r in samples[:3]]
    assert len({r.output_text for r in samples}) > 1  # the seeds draw different answers
    assert all(r.logprobs_mode == "processed_logprobs" for r in samples)
    # one prefill: without a prefix cache, every completion but one reused the whole prompt
    usage = [(r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens) for r in samples]
    assert sorted(cached for _, cached in usage) == [0] + [usage[0][0]] * 5

    async with _engine(tiny_fused, tokenizer, prefix_cache_bytes=0) as engine:  # a restart
        client = engine.client()
        for seed, sampled in zip(seeds, samples, strict=True):
            alone = await client.responses.create(
                input=question,
                include=LOGPROBS,
                extra_body={"seed": seed, "logprobs_mode": "processed_logprobs"},
                **SAMPLE,
            )
            assert numbers(alone) == numbers(sampled), seed
            assert alone.output_text == sampled.output_text

    frame = samples_frame(samples)
    assert frame["count"].sum() == 6 and frame.attrs["n"] == 6
    for _, row in frame.iterrows():  # each answer's sequence logprob is its tokens' sum
        member = next(r for r in samples if r.id == row["response_ids"][0])
        raw = [n[1] for n in numbers(member)]
        processed = [n[2] for n in numbers(member)]
        assert row["sequence_logprob"] == pytest.approx(float(np.sum(raw)), abs=1e-9)
        assert row["sequence_processed_logprob"] == pytest.approx(float(np.sum(processed)))


async def test_sample_rejects_what_it_cannot_honour(tiny_fused, tokenizer):
    async with _engine(tiny_fused, tokenizer) as engine:
        with pytest.raises(ValueError, match="n must be"):
            await engine.sample("hi", n=0)
        with pytest.raises(TypeError, match="stream"):
            await engine.sample("hi", n=2, stream=True)
        with pytest.raises(TypeError, match="seed"):
            await engine.sample("hi", n=2, extra_body={"seed": 1})
        import openai

        with pytest.raises(openai.BadRequestError) as err:  # the create's own 400, for all
            await engine.sample("hi", n=3, seed=1, temperature=3.0)
        assert err.value.param == "temperature"
        # nothing left held: a plain request right after runs at once, not waiting for mates
        plain = engine.client().responses.create(input="hi", max_output_tokens=2)
        assert (await asyncio.wait_for(plain, 60)).output
        ok = await engine.sample("hi", n=2, seed=1, max_output_tokens=4)
        assert len(ok) == 2
