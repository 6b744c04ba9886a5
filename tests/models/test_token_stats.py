"""The compiled core of ``sampling.token_logprob`` (``kernels.TokenStats``, ``token_stats.cc``):
what the engine uses for the logprobs, ranks and entropies of the models that use our operators.

It promises numpy's definition (``sampling.log_softmax``): checked against an independent
float64 computation, and against numpy's own code (the logprob and rank the same; the
log-softmax the same but for the last bit of values near 0), the same bits from the AVX-512 and
the AVX2 code, and NaN in, NaN out; and its top k (``TokenStats.top``) against numpy's
``sampling.top_k``, ties included.
"""

from __future__ import annotations

import numpy as np
import pytest

from nbresponses.models import kernels
from nbresponses.runtime import sampling

ISAS = {"native": (), "avx2": ("-mno-avx512f",)}


def _stats(isa: str = "native") -> kernels.TokenStats:
    try:
        return kernels.token_stats(ISAS[isa])
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))


def _rows(seed: int = 0):
    """Rows of logits as models give them, and harder: peaked, flat, with -inf, odd sizes."""
    rng = np.random.default_rng(seed)
    for vocab in (1, 2, 15, 16, 17, 100, 49152, 49153, 151936):
        for scale in (0.01, 1.0, 4.0, 60.0):
            row = (rng.standard_normal(vocab) * scale).astype(np.float32)
            yield row, int(rng.integers(vocab))
    row = np.zeros(1000, np.float32)  # flat: every rank 1, entropy log(1000)
    yield row, 3
    row = np.full(500, -np.inf, np.float32)  # one finite logit: certain
    row[7] = 2.5
    yield row, 7
    row = (np.random.default_rng(seed + 1).standard_normal(4096) * 3).astype(np.float32)
    row[::5] = -np.inf  # banned tokens: their probability is 0, not NaN
    yield row, 1


def _reference(row: np.ndarray, token: int) -> tuple[float, int, float]:
    """An independent float64 computation (the rank from float64 values)."""
    x = row.astype(np.float64)
    shifted = x - x.max()
    lse = np.log(np.exp(shifted).sum())
    logp = shifted - lse
    p = np.exp(logp)
    seen = p > 0
    entropy = float(-(p[seen] * logp[seen]).sum())
    return float(logp[token]), 1 + int(np.count_nonzero(logp > logp[token])), entropy


def test_logprob_rank_and_entropy_against_a_float64_computation() -> None:
    stats = _stats()
    for row, token in _rows():
        logprob, rank, entropy = stats(row, token)
        expected_logprob, expected_rank, expected_entropy = _reference(row, token)
        # float32's rounding of the shift and of the normalizer, no more
        assert logprob == pytest.approx(expected_logprob, rel=3e-7, abs=3e-7)
        assert entropy == pytest.approx(expected_entropy, rel=1e-6, abs=1e-9)
        # float32 logprobs may tie where float64 ones do not: never ranked higher than float64
        assert rank <= expected_rank
        assert rank == 1 + int(np.count_nonzero(sampling.log_softmax(row) > logprob))


def _same(a: float, b: float) -> bool:
    """The same float32, or both within 1e-6 of 0 (see below)."""
    return a == b or (abs(a) < 1e-6 and abs(b) < 1e-6)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy: 0 * -inf
def test_the_numbers_numpys_code_gives() -> None:
    stats = _stats()
    for row, token in _rows(seed=3):
        ours = sampling.token_logprob(row, token, 5, details=True, distribution=True, native=stats)
        numpys = sampling.token_logprob(row, token, 5, details=True, distribution=True)
        assert _same(ours.logprob, numpys.logprob) and ours.rank == numpys.rank
        assert [i for i, _ in ours.top] == [i for i, _ in numpys.top]
        assert all(_same(a, b) for (_, a), (_, b) in zip(ours.top, numpys.top, strict=True))
        if np.isfinite(numpys.entropy):  # numpy's entropy is NaN when a logit is -inf
            assert ours.entropy == pytest.approx(numpys.entropy, rel=1e-6, abs=1e-9)
        # the log-softmax: the normalizers' float64 sums differ in their ~16th digit, which
        # reaches float32's last bit only for values near 0
        assert ours.distribution is not None and numpys.distribution is not None
        apart = ours.distribution != numpys.distribution
        assert np.all(np.abs(ours.distribution[apart]) < 1e-6)
        assert apart.mean() < 1e-3


def test_avx512_and_avx2_give_the_same_bits() -> None:
    native, plain = _stats("native"), _stats("avx2")
    for row, token in _rows(seed=5):
        a, b = np.empty_like(row), np.empty_like(row)
        assert native(row, token, a) == plain(row, token, b)
        np.testing.assert_array_equal(a, b)
        assert native.top(a, 20) == plain.top(b, 20)


def _tied(seed: int):
    """Rows whose values repeat: the order among equals is the lower index first."""
    rng = np.random.default_rng(seed)
    for vocab in (3, 40, 49152):
        yield np.round(rng.standard_normal(vocab) * 2).astype(np.float32)  # a few values
    row = np.zeros(300, np.float32)
    row[[5, 250, 17]] = 1.0  # three best, tied, found out of order
    yield row
    yield np.full(64, -np.inf, np.float32)  # no finite value: all -inf, in index order


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_top_is_numpys_top_k(isa) -> None:
    """The same pairs, in the same order, as ``sampling.top_k`` over the same log-softmax, for
    every k an API allows; shorter rows give all they have."""
    stats = _stats(isa)
    rows = [sampling.log_softmax(row) for row, _ in _rows(seed=11)]
    rows += [sampling.log_softmax(row) for row in _tied(12) if np.isfinite(row).any()]
    rows += list(_tied(13))  # any float row, as it is: -inf throughout, ties between finite ones
    for logp in rows:
        for k in (0, 1, 2, 3, 5, 19, 20):
            expected = tuple((int(i), float(logp[i])) for i in sampling.top_k(logp, k))
            assert stats.top(logp, k) == expected, (logp.shape, k)


def test_a_row_gives_the_same_bits_wherever_it_sits_in_memory() -> None:
    """A scoring run's rows are views of one buffer, a decode step's a row of another: the
    numbers depend on the row's values alone, not on its address (any float offset, so no
    alignment-dependent peeling changes a sum)."""
    stats = _stats()
    row = (np.random.default_rng(9).standard_normal(49153) * 3).astype(np.float32)
    expected = stats(row, 17)
    memory = np.zeros(row.shape[0] + 16, np.float32)
    for offset in range(16):
        memory[offset : offset + row.shape[0]] = row
        assert stats(memory[offset : offset + row.shape[0]], 17) == expected


def test_nan_in_nan_out_and_bad_calls_refused() -> None:
    stats = _stats()
    row = np.ones(64, np.float32)
    row[40] = np.nan
    logprob, _, entropy = stats(row, 2)
    assert np.isnan(logprob) and np.isnan(entropy)
    # the log-softmax NaN throughout, as numpy's, and so no alternatives
    ours = sampling.token_logprob(row, 2, 5, distribution=True, native=stats)
    numpys = sampling.token_logprob(row, 2, 5, distribution=True)
    assert ours.top == numpys.top == ()
    assert ours.distribution is not None and np.isnan(ours.distribution).all()
    with pytest.raises(ValueError, match="token"):
        stats(np.ones(8, np.float32), 8)
    with pytest.raises(ValueError, match="logp"):
        stats(np.ones(8, np.float32), 1, np.empty(8, np.float64))


def _one_vocabulary(seed: int, vocab: int = 4099):
    """``_rows``' kinds of row at one vocabulary size (the rows of one batch)."""
    rng = np.random.default_rng(seed)
    rows = [(rng.standard_normal(vocab) * s).astype(np.float32) for s in (0.01, 1.0, 4.0, 60.0)]
    rows += [np.zeros(vocab, np.float32), np.full(vocab, -np.inf, np.float32)]
    rows[-1][7] = 2.5  # one finite logit
    rows.append(rows[2].copy())
    rows[-1][::5] = -np.inf  # banned tokens
    rows.append(np.ones(vocab, np.float32))
    rows[-1][40] = np.nan  # NaN in, NaN out
    rows += [np.round(rng.standard_normal(vocab) * 2).astype(np.float32)]  # ties
    tokens = [int(t) for t in rng.integers(vocab, size=len(rows))]
    tokens[5] = 7
    return np.stack(rows), tokens


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_rows_at_once_are_each_row_alone(isa, threads) -> None:
    """``rows``: every row's numbers, log-softmax and top k the bits a row alone gets, on any
    number of threads, rows read from a wider buffer too (a scoring run's logits are views)."""
    stats = _stats(isa)
    logits, tokens = _one_vocabulary(seed=21)
    wide = np.zeros((logits.shape[0], logits.shape[1] + 13), np.float32)
    wide[:, 5 : 5 + logits.shape[1]] = logits
    for given in (logits, wide[:, 5 : 5 + logits.shape[1]]):
        for k in (0, 1, 20):
            logp = np.empty_like(logits)
            found = stats.rows(given, tokens, k, logp, threads=threads)
            for r, (row, token) in enumerate(zip(logits, tokens, strict=True)):
                alone = np.empty_like(row)
                logprob, rank, entropy = stats(row, token, alone)
                assert np.array_equal(
                    [found.logprob[r], found.entropy[r]], [logprob, entropy], equal_nan=True
                )
                assert found.rank[r] == rank
                np.testing.assert_array_equal(logp[r], alone)
                count = found.counts[r]
                best = tuple(
                    zip(
                        found.ids[r, :count].tolist(),
                        found.values[r, :count].tolist(),
                        strict=True,
                    )
                )
                assert best == stats.top(alone, k)
        without = stats.rows(given, tokens, threads=threads)  # no log-softmax written
        np.testing.assert_array_equal(without.rank, found.rank)
        np.testing.assert_array_equal(without.logprob, found.logprob)


def test_rows_refuse_what_a_row_alone_refuses() -> None:
    stats = _stats()
    logits = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match="token"):
        stats.rows(logits, [1, 8, 2])
    with pytest.raises(ValueError, match="token"):
        stats.rows(logits, [1, 2])
    with pytest.raises(ValueError, match="one token a row"):
        sampling.token_logprobs(logits, [1, 2], 0, native=stats)
    with pytest.raises(ValueError, match="give logp"):
        stats.rows(logits, [1, 2, 3], k=5)
    with pytest.raises(ValueError, match="logp"):
        stats.rows(logits, [1, 2, 3], k=5, logp=np.empty((3, 8), np.float64))
    with pytest.raises(ValueError, match="float32"):
        stats.rows(logits.astype(np.float64), [1, 2, 3])
    with pytest.raises(ValueError, match="float32"):
        stats.rows(np.asfortranarray(logits), [1, 2, 3])
    assert stats.rows(logits[:0], []).rank.shape == (0,)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy: 0 * -inf
def test_a_runs_logprobs_are_each_rows_alone() -> None:
    """``sampling.token_logprobs`` (a scoring run's positions, in calls of 16 rows) gives what
    ``token_logprob`` gives each row, with the compiled core and with numpy's code; a row's
    distribution is its own copy."""
    stats = _stats()
    logits, tokens = _one_vocabulary(seed=23)
    logits, tokens = np.concatenate([logits] * 4)[:37], (tokens * 4)[:37]  # several blocks
    for native in (stats, None):
        for top, details, distribution in ((0, True, False), (5, False, True), (20, True, True)):
            together = sampling.token_logprobs(
                logits,
                tokens,
                top,
                details=details,
                distribution=distribution,
                native=native,
                threads=2,
            )
            alone = [
                sampling.token_logprob(
                    row, token, top, details=details, distribution=distribution, native=native
                )
                for row, token in zip(logits, tokens, strict=True)
            ]
            assert len(together) == len(alone)
            for a, b in zip(together, alone, strict=True):
                assert (a.token_id, a.top, a.rank) == (b.token_id, b.top, b.rank)
                assert np.array_equal([a.logprob], [b.logprob], equal_nan=True)
                assert a.entropy is b.entropy or np.array_equal(
                    [a.entropy], [b.entropy], equal_nan=True
                )
                if distribution:
                    np.testing.assert_array_equal(a.distribution, b.distribution)
                    assert a.distribution.base is None  # not a view of a shared buffer
                else:
                    assert a.distribution is None


def test_the_engine_uses_it_for_models_with_our_operators_only(
    tiny_source, tiny_model, cache_dir
) -> None:
    """Decided by the model file: a model's logprobs always come from one code."""
    from nbresponses.models.prepare import prepare_model
    from nbresponses.runtime.runner import OnnxRunner

    stats = _stats()
    kernel = prepare_model(tiny_source, "fused-int8-kernel", cache_dir=cache_dir, progress=False)
    assert OnnxRunner(kernel.onnx_path).token_stats is stats
    assert OnnxRunner(tiny_model.onnx_path).token_stats is None
