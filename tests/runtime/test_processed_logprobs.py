"""``sampling.processed_logprob``: the logprob under the distribution a draw picks from, checked
against an independent numpy computation and against the draws themselves."""

from __future__ import annotations

import numpy as np
import pytest

from nbresponses.runtime import sampling
from nbresponses.tokens.contract import SamplingParams


def _reference(logits, token, *, temperature=1.0, top_k=0, top_p=1.0) -> float:
    """Softmax of logits / temperature, cut to the k best and then to the smallest set of most
    likely tokens whose mass reaches top_p, renormalised (sorts the whole vocabulary)."""
    x = np.asarray(logits, np.float64) / temperature
    allowed = np.isfinite(x)
    if top_k:
        allowed &= x >= np.sort(x)[-top_k]
    p = np.where(allowed, np.exp(x - x[allowed].max()), 0.0)
    p /= p.sum()
    kept = np.flatnonzero(p > 0)
    if top_p < 1:
        order = np.lexsort((np.arange(len(p)), -p))
        kept = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    return float(np.log(p[token] / p[kept].sum())) if token in kept else -np.inf


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 0.6},
        {"temperature": 1.7},
        {"temperature": 0.8, "top_p": 0.9},
        {"temperature": 1.0, "top_p": 0.5},
        {"temperature": 0.9, "top_k": 40},
        {"temperature": 1.2, "top_k": 200, "top_p": 0.8},
    ],
)
def test_processed_logprob_equals_numpy(options):
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, 5000).astype(np.float32)
    params = SamplingParams(**options)
    order = np.argsort(-logits)
    for token in [*order[:30], *order[-3:]]:
        got = sampling.processed_logprob(logits, int(token), params)
        want = _reference(logits, int(token), **options)
        if np.isinf(want):
            assert got == -np.inf
        else:
            assert got == pytest.approx(want, abs=1e-9)


def test_drawn_tokens_follow_the_processed_distribution():
    """Every draw lands in the kept set, with the frequencies exp(processed) says."""
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], np.float32))
    params = SamplingParams(temperature=0.7, top_p=0.8, seed=1)
    probs = np.exp([sampling.processed_logprob(logits, t, params) for t in range(6)])
    assert probs.sum() == pytest.approx(1.0) and probs[-1] == 0
    rng = sampling.make_rng(params)
    draws = np.bincount([sampling.choose(logits, params, rng) for _ in range(20000)], minlength=6)
    np.testing.assert_allclose(draws / draws.sum(), probs, atol=0.015)


def test_a_grammar_mask_is_part_of_the_processed_distribution():
    logits = np.random.default_rng(2).normal(0, 2, 300).astype(np.float32)
    masked = logits.copy()
    masked[::2] = -np.inf
    params = SamplingParams(temperature=0)  # greedy: the model's own (masked) distribution
    token = int(np.argmax(masked))
    x = logits[1::2].astype(np.float64)
    want = x[token // 2] - x.max() - np.log(np.exp(x - x.max()).sum())
    assert sampling.processed_logprob(masked, token, params) == pytest.approx(want, abs=1e-9)
    assert sampling.processed_logprob(masked, 0, params) == -np.inf
    assert sampling.processes(params, masked=True) and not sampling.processes(params)


def test_what_reshapes_the_distribution():
    assert not sampling.processes(SamplingParams(temperature=0, top_p=0.3, top_k=5))
    assert not sampling.processes(SamplingParams(temperature=1.0))
    assert sampling.processes(SamplingParams(temperature=0.99))
    assert sampling.processes(SamplingParams(top_p=0.99))
    assert sampling.processes(SamplingParams(top_k=50))


@pytest.mark.parametrize("seed", [0, 5, 2**63 - 1, -1, -(2**63)])
def test_every_int64_seed_names_one_stream(seed):
    a = sampling.make_rng(SamplingParams(seed=seed)).random(4)
    b = sampling.make_rng(SamplingParams(seed=seed)).random(4)
    assert a.tolist() == b.tolist()
    if seed >= 0:  # non-negative seeds keep numpy's own meaning
        assert a.tolist() == np.random.default_rng(seed).random(4).tolist()
    assert sampling.make_rng(SamplingParams(seed=-1)).random() != np.random.default_rng(1).random()


@pytest.mark.parametrize("seed", [1.5, True, "3"])
def test_a_seed_must_be_an_integer(seed):
    with pytest.raises(ValueError, match="seed"):
        sampling.validate(SamplingParams(seed=seed))
