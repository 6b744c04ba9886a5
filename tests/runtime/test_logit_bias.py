"""``logit_bias`` (OpenAI's): added to a row's logits before its choice, greedy included.

The sampling functions are checked against an independent numpy computation of the biased
distribution; the engine on the tiny model: a +100 bias makes greedy pick the token, -100 bans
it, raw logprobs stay the model's own and processed ones are the biased distribution's, and a
biased row changes nothing of its batch-mates (and is the same alone or batched).
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from helpers.determinism import run_matrix
from helpers.engine import PROMPTS, chat_ids

from nbresponses.models.prepare import prepare_model
from nbresponses.runtime import sampling, scheduler
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams


def _biased_reference(logits, bias: dict[int, float]) -> np.ndarray:
    """The logits a choice sees: float32 logits plus the float32 bias (vLLM adds it so)."""
    x = np.array(logits, np.float32)
    for token, value in bias.items():
        x[token] = x[token] + np.float32(value)
    return x


def _processed_reference(logits, token, *, temperature=1.0, top_p=1.0) -> float:
    """Softmax of logits / temperature, cut to the smallest most likely set reaching top_p."""
    x = np.asarray(logits, np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.lexsort((np.arange(len(p)), -p))
    kept = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    return float(np.log(p[token] / p[kept].sum())) if token in kept else -np.inf


LOGITS = np.random.default_rng(11).normal(0, 3, 4000).astype(np.float32)


def test_the_bias_is_added_to_a_copy_of_the_logits():
    bias = {5: 2.5, 17: -100.0, 3999: 100.0, 40: 0.25}
    params = SamplingParams(logit_bias=bias)
    before = LOGITS.copy()
    got = sampling.biased(LOGITS, sampling.bias_of(params))
    np.testing.assert_array_equal(got, _biased_reference(LOGITS, bias))
    np.testing.assert_array_equal(LOGITS, before)  # the row's own logits, for its logprobs
    assert sampling.bias_of(SamplingParams(logit_bias={3: 0.0})) is None  # nothing to add
    assert sampling.bias_of(SamplingParams()) is None


def test_greedy_takes_a_token_with_plus_100_and_never_one_with_minus_100():
    params = SamplingParams(temperature=0)
    rng = sampling.make_rng(params)
    top = int(np.argmax(LOGITS))
    low = int(np.argmin(LOGITS))
    up = sampling.bias_of(dataclasses.replace(params, logit_bias={low: 100.0}))
    assert sampling.choose(sampling.biased(LOGITS, up), params, rng) == low
    ban = sampling.bias_of(dataclasses.replace(params, logit_bias={top: -100.0}))
    second = int(np.argsort(-LOGITS)[1])
    assert sampling.choose(sampling.biased(LOGITS, ban), params, rng) == second


def test_minus_100_bans_a_token_from_draws():
    """The three most likely tokens hold most of the mass; banned, no draw picks them."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.03, 0.02], np.float32))
    params = SamplingParams(temperature=1.0, seed=3, logit_bias={0: -100, 1: -100, 2: -100})
    rng = sampling.make_rng(params)
    drawn_from = sampling.biased(logits, sampling.bias_of(params))
    draws = [sampling.choose(drawn_from, params, rng) for _ in range(5000)]
    draws = np.bincount(draws, minlength=5)
    assert draws[:3].sum() == 0 and draws[3] > draws[4] > 0
    np.testing.assert_allclose(draws[3:] / draws.sum(), [0.6, 0.4], atol=0.03)


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 0},
        {"temperature": 1.0},
        {"temperature": 0.7},
        {"temperature": 1.2, "top_p": 0.8},
    ],
)
def test_processed_logprobs_are_the_biased_distributions(options):
    bias = {int(t): b for t, b in zip(np.argsort(LOGITS)[:5], [9, 12, 15, -3, 20], strict=True)}
    bias[int(np.argmax(LOGITS))] = -100.0
    params = SamplingParams(**options, logit_bias=bias)
    assert sampling.processes(params)  # greedy too: the bias reshapes what is chosen from
    drawn_from = sampling.biased(LOGITS, sampling.bias_of(params))
    reference = _biased_reference(LOGITS, bias)
    temperature = options["temperature"] or 1.0  # greedy: the biased distribution itself
    for token in [*bias, *np.argsort(-LOGITS)[:10]]:
        got = sampling.processed_logprob(drawn_from, int(token), params)
        want = _processed_reference(
            reference, int(token), temperature=temperature, top_p=options.get("top_p", 1.0)
        )
        if np.isinf(want):
            assert got == -np.inf
        else:
            assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize(
    ("bias", "message"),
    [
        ({-1: 1.0}, "logit_bias keys"),
        ({"5": 1.0}, "logit_bias keys"),
        ({True: 1.0}, "logit_bias keys"),
        ({5: float("nan")}, "finite number"),
        ({5: "high"}, "finite number"),
    ],
)
def test_validate_names_a_bad_bias(bias, message):
    with pytest.raises(ValueError, match=message):
        sampling.validate(SamplingParams(logit_bias=bias))


def test_params_with_a_bias_compare_and_hash():
    a = SamplingParams(logit_bias={1: 2.0})
    assert a == SamplingParams(logit_bias={1: 2.0}) and a != SamplingParams(logit_bias={1: 3.0})
    hash(a)  # a dict field left out of the hash, as the constraint factory is


# -- on the tiny model ----------------------------------------------------------------------


def _log_softmax(row: np.ndarray) -> np.ndarray:
    x = np.asarray(row, np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def _model_logits(engine: TokenGenerator, ids: list[int]) -> np.ndarray:
    runner = engine.runner
    logits, _ = runner.run(
        np.array([ids], np.int64),
        np.ones((1, len(ids)), np.int64),
        np.arange(len(ids), dtype=np.int64)[None],
        runner.layout.empty(),
        position=None,
    )
    return np.asarray(logits, np.float64)


async def test_the_engine_biases_the_choice_not_the_logprobs(tiny_fused, tokenizer):
    """Greedy with +100 on a token the model does not favour: every token is that one; the raw
    logprobs are the model's own (unbiased), the processed ones the biased distribution's."""
    prompt = chat_ids(tokenizer, PROMPTS[0])
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        plain = SamplingParams(max_tokens=6, temperature=0, logprobs=True, ignore_eos=True)
        free = [t async for s in engine.generate(prompt, plain) for t in s.token_ids]
        target = 1000 if 1000 not in free else 1001
        bias = {target: 100.0, free[0]: -100.0}
        params = dataclasses.replace(plain, processed_logprobs=True, logit_bias=bias)
        steps = [s async for s in engine.generate(prompt, params)]
        tokens = [t for s in steps for t in s.token_ids]
        assert tokens == [target] * 6
        logits = _model_logits(engine, prompt + tokens[:-1])[len(prompt) - 1 :]
    for i, lp in enumerate(lp for s in steps for lp in s.logprobs or ()):
        raw = _log_softmax(logits[i])
        assert lp.logprob == pytest.approx(raw[target], abs=1e-5)
        assert lp.logprob < -1  # the model's own: far from certain
        biased = _log_softmax(_biased_reference(logits[i].astype(np.float32), bias))
        assert lp.processed == pytest.approx(biased[target], abs=1e-5)
        assert lp.processed > -1e-3  # near-certain once biased


async def test_a_banned_token_never_comes(tiny_fused, tokenizer):
    prompt = chat_ids(tokenizer, PROMPTS[1])
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        plain = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        free = [t async for s in engine.generate(prompt, plain) for t in s.token_ids]
        banned = dataclasses.replace(plain, logit_bias=dict.fromkeys(set(free), -100.0))
        tokens = [t async for s in engine.generate(prompt, banned) for t in s.token_ids]
        assert len(tokens) == 8 and not set(tokens) & set(free)
        with pytest.raises(ValueError, match="logit_bias token ids"):
            engine.generate(prompt, dataclasses.replace(plain, logit_bias={10**7: 1.0}))


async def one(engine: TokenGenerator, prompt: list[int], params: SamplingParams) -> list:
    return [s async for s in engine.generate(prompt, params)]


async def test_a_biased_row_changes_no_batch_mate(tiny_fused, tokenizer):
    """Each request alone, then all at once: the same steps, bit for bit."""
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS[:4]]
    base = SamplingParams(max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    params = [
        base,
        dataclasses.replace(base, logit_bias={1000: 100.0}, processed_logprobs=True),
        dataclasses.replace(base, temperature=0.9, seed=4, logit_bias={28: 5.0, 30: -100.0}),
        dataclasses.replace(base, temperature=0.8, seed=9),
    ]
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        alone = [await one(engine, p, q) for p, q in zip(prompts, params, strict=True)]

    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        runs = (one(engine, p, q) for p, q in zip(prompts, params, strict=True))
        together = await asyncio.gather(*runs)
    assert together == alone
    assert [t for s in alone[1] for t in s.token_ids] == [1000] * 10


async def test_the_determinism_matrix_with_a_bias(tiny_source, cache_dir, tokenizer, monkeypatch):
    """The matrix of ``test_determinism.py`` (prefix hits, ragged batches, restarts,
    follow-ups) for a seeded biased request on the fused graph."""
    monkeypatch.setattr(scheduler, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(scheduler, "IDLE_CHUNK", 6)
    prepared = prepare_model(tiny_source, "fused-fp32", cache_dir=cache_dir, progress=False)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    params = SamplingParams(
        max_tokens=16, temperature=0.9, top_p=0.95, seed=7, logprobs=True,
        processed_logprobs=True, logit_bias={28: 4.0, 1000: 6.0, 30: -100.0},
    )  # fmt: skip
    follow_up = chat_ids(tokenizer, "And why?")[1:]
    failures = await run_matrix(
        prepared, tokenizer, [prompts[0]], [prompts[1], prompts[3]], params, follow_up,
        max_batch_size=6,
    )  # fmt: skip
    assert not failures, "\n".join(failures)
