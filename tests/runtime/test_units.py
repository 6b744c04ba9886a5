"""Engine building blocks on their own: sampling, logprobs, prefix cache, batch KV layouts."""

from __future__ import annotations

import numpy as np
import pytest

from nbresponses.runtime import sampling
from nbresponses.runtime.kv import EndPaddedKV, KVLayout, SeparateKV
from nbresponses.runtime.prefix_cache import PrefixCache
from nbresponses.tokens.contract import SamplingParams


def test_log_softmax_matches_torch():
    import torch

    logits = np.random.default_rng(0).normal(0, 8, 49152).astype(np.float32)
    expected = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    np.testing.assert_allclose(sampling.log_softmax(logits), expected, atol=1e-5)


def test_token_logprob_top_alternatives():
    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)
    lp = sampling.token_logprob(logits, 2, top=3)
    logp = sampling.log_softmax(logits)
    assert lp.logprob == pytest.approx(float(logp[2]))
    assert [t for t, _ in lp.top] == [1, 3, 2]  # ties: lower id first


def _reference_logprob(logits, token, top, details):
    """The plain formula: full log-softmax, sort, rank and entropy over fresh arrays."""
    logp = sampling.log_softmax(logits)
    order = np.lexsort((np.arange(logp.shape[0]), -logp))[:top]
    rank = entropy = None
    if details:
        rank = 1 + int(np.count_nonzero(logp > logp[token]))
        weights = np.exp((logits - logits.max()).astype(np.float64))  # the softmax's terms
        entropy = float(-(weights * logp).sum() / weights.sum())
    return float(logp[token]), tuple((int(i), float(logp[i])) for i in order), rank, entropy


def test_entropy_is_closer_to_float64_than_the_exp_of_rounded_logprobs():
    """The entropy shares the softmax's exp (one pass over the vocabulary, not two), and is
    more faithful for it: against a float64 log-softmax, its error is smaller on average and
    at worst than the former -sum(exp(float32 logp) * logp)'s, on peaked and flat rows."""
    rng = np.random.default_rng(3)
    ours, former = [], []
    for scale in (0.5, 3, 8, 20):
        for _ in range(10):
            logits = rng.normal(0, scale, 49152).astype(np.float32)
            wide = logits.astype(np.float64)
            lp64 = wide - wide.max()
            lp64 -= np.log(np.exp(lp64).sum())
            truth = -(np.exp(lp64) * lp64).sum()
            logp = sampling.log_softmax(logits)
            old = -(np.exp(logp.astype(np.float64)) * logp).sum()
            got = sampling.token_logprob(logits, 0, 0, details=True).entropy
            ours.append(abs(got - truth) / truth)
            former.append(abs(old - truth) / truth)
    assert np.mean(ours) < np.mean(former) / 2
    assert max(ours) < max(former)


def test_token_logprob_gives_the_plain_formula_bit_for_bit():
    """Reused buffers and the block-maximum top-k change no bit of any field, whatever the
    row length, spread or ties (rounded logits tie often), for the chosen token anywhere."""
    rng = np.random.default_rng(1)
    rows = [
        rng.normal(0, scale, n).astype(np.float32)
        for n in (49152, 50, 64, 1000, 7)
        for scale in (0.5, 8)
    ]
    rows += [np.round(rng.normal(0, 4, 49152), 1).astype(np.float32) for _ in range(3)]
    rows.append(np.zeros(300, np.float32))  # every value tied
    for logits in rows:
        for token in (0, int(np.argmax(logits)), logits.shape[0] - 1):
            for top in (0, 1, 5, 20):
                got = sampling.token_logprob(logits, token, top, details=True)
                expected = _reference_logprob(logits, token, top, True)
                assert (got.logprob, got.top, got.rank, got.entropy) == expected


def test_top_k_breaks_ties_by_lower_index():
    values = np.array([5.0] * 130 + [7.0, 7.0] + [5.0] * 70, np.float32)
    assert sampling.top_k(values, 4).tolist() == [130, 131, 0, 1]
    assert sampling.top_k(values, 0).tolist() == []
    assert sampling.top_k(values, 500).tolist() == [130, 131, *range(130), *range(132, 202)]


def test_filters_that_leave_one_token_are_greedy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(0, 3, 1000).astype(np.float32)
        best = int(np.argmax(logits))
        assert sampling.choose(logits, SamplingParams(top_k=1), rng) == best
        assert sampling.choose(logits, SamplingParams(top_p=1e-6), rng) == best


def test_sampling_follows_the_tempered_filtered_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    rng = np.random.default_rng(1)
    n = 20000

    def freq(params):
        draws = [sampling.choose(logits, params, rng) for _ in range(n)]
        return np.bincount(draws, minlength=4) / n

    np.testing.assert_allclose(freq(SamplingParams()), [0.5, 0.3, 0.15, 0.05], atol=0.015)
    np.testing.assert_allclose(freq(SamplingParams(top_k=2)), [0.625, 0.375, 0, 0], atol=0.015)
    np.testing.assert_allclose(freq(SamplingParams(top_p=0.7)), [0.625, 0.375, 0, 0], atol=0.015)
    hot = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    np.testing.assert_allclose(freq(SamplingParams(temperature=0.5)), hot / hot.sum(), atol=0.015)


def test_same_seed_same_draws():
    logits = np.random.default_rng(3).normal(0, 2, 5000).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    a = [sampling.choose(logits, params, r) for r in [sampling.make_rng(params)] * 30]
    b = [sampling.choose(logits, params, r) for r in [sampling.make_rng(params)] * 30]
    assert a == b and len(set(a)) > 1


def _row(tokens: int, fill: float) -> list[np.ndarray]:
    return [np.full((2, tokens, 4), fill + i, np.float32) for i in range(3)]


def test_prefix_cache_longest_match_and_lru():
    per_token = 3 * 2 * 4 * 4
    cache = PrefixCache(budget_bytes=per_token * 10)
    cache.store((1, 2, 3, 4), _row(4, 0))
    cache.store((1, 2, 9), _row(3, 10))
    k, kv = cache.lookup((1, 2, 3, 4, 5))
    assert k == 4 and kv[0].shape == (2, 4, 4) and kv[0][0, 0, 0] == 0
    k, kv = cache.lookup((1, 2, 9, 7))
    assert k == 3 and kv[1][0, 0, 0] == 11
    assert cache.lookup((1, 2, 3, 4))[0] == 3  # one token always left to compute
    assert cache.lookup((1, 2, 3, 4), leave=0)[0] == 4  # unless the caller asks for all
    assert cache.lookup((5, 6)) == (0, None)
    cache.store((1, 2, 3, 4, 5), _row(5, 20))  # supersedes (1, 2, 3, 4); evicts LRU beyond budget
    assert cache.nbytes <= per_token * 10
    # (1, 2, 3, 4) went, not the least recently used (1, 2, 9): 3 + 5 tokens held, not 4 + 5
    assert len(cache) == 2 and cache.nbytes == per_token * 8
    assert cache.lookup((1, 2, 9, 7))[0] == 3


LAYOUT = KVLayout.uniform(
    ("a", "b"), ("pa", "pb"), kv_heads=2, head_dim=4, dtype=np.dtype("float32")
)


class _AppendingRunner:
    """Stands in for the model: records what a step is fed and, in place, writes the new
    column where GroupQueryAttention would (at each row's own length)."""

    def __init__(self, batch=None):
        self.batch, self.calls = batch, []

    def run(self, ids, mask, positions, past, *, in_place=False):
        self.calls.append((ids.copy(), mask.copy(), positions.copy()))
        if in_place:
            for array in self.batch._values:
                for row, n in enumerate(self.batch.lengths):
                    array[row, :, n] = 100 + ids[row, 0]
            return np.zeros((len(ids), 7), np.float32), past
        column = np.full((1, 2, 1, 4), 100 + ids[0, 0], np.float32)
        values = [v if isinstance(v, np.ndarray) else v.numpy() for v in past]
        return np.zeros((1, 7), np.float32), [np.concatenate([v, column], 2) for v in values]


def test_end_padded_kv_keeps_every_row_at_column_zero():
    kv = EndPaddedKV(LAYOUT)
    runner = _AppendingRunner(kv)
    kv.add_rows([[np.ones((2, 3, 4), np.float32)] * 2])
    kv.add_rows([[np.full((2, 5, 4), 2, np.float32)] * 2])
    assert kv.lengths == [3, 5] and kv.capacity >= 6
    kv.step(runner, [7, 8])
    _, mask, positions = runner.calls[-1]
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0, 0], [1] * 6])  # ones first, per row
    np.testing.assert_array_equal(positions, [[3], [5]])
    assert kv.lengths == [4, 6]
    first = kv.row(0)[0]
    assert first.shape == (2, 4, 4) and (first[:, :3] == 1).all() and (first[:, 3] == 107).all()
    kv.remove([1])  # the long row leaves
    assert kv.lengths == [4] and kv.row(0)[1].shape == (2, 4, 4)
    np.testing.assert_array_equal(kv.row(0)[0], first)


def test_end_padded_kv_grows_past_its_headroom(monkeypatch):
    from nbresponses.runtime import kv as kv_module

    monkeypatch.setattr(kv_module, "HEADROOM", 2)
    kv = EndPaddedKV(LAYOUT)
    runner = _AppendingRunner(kv)
    kv.add_rows([[np.ones((2, 1, 4), np.float32)] * 2])
    for token in range(9):  # more steps than spare columns: the buffers are re-made
        kv.step(runner, [token])
        assert kv.capacity > kv.lengths[0] - 1
    np.testing.assert_array_equal(kv.row(0)[0][0, :, 0], [1] + [100 + t for t in range(9)])


def test_end_padded_add_rows_at_once_equals_one_by_one():
    rng = np.random.default_rng(0)
    first = [rng.normal(size=(2, 4, 4)).astype(np.float32) for _ in range(2)]
    joining = [[rng.normal(size=(2, n, 4)).astype(np.float32) for _ in range(2)] for n in (6, 2)]
    one_by_one, at_once = EndPaddedKV(LAYOUT), EndPaddedKV(LAYOUT)
    for kv in (one_by_one, at_once):
        kv.add_rows([first])
    for row in joining:
        one_by_one.add_rows([row])
    at_once.add_rows(joining)
    assert at_once.lengths == one_by_one.lengths == [4, 6, 2]
    for a, b in zip(at_once._values, one_by_one._values, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(at_once.row(1)[1], joining[0][1])
    np.testing.assert_array_equal(at_once.row(2)[0], joining[1][0])
    at_once.add_rows([])  # nothing admitted: nothing changes
    assert at_once.size == 3


def _filled(length: int, value: float) -> list[np.ndarray]:
    return [np.full((2, length, 4), value, np.float32)] * 2


def test_end_padded_kv_reuses_the_rows_finished_requests_leave():
    kv = EndPaddedKV(LAYOUT)
    kv.add_rows([_filled(3, 1), _filled(5, 2), _filled(4, 3)])
    store = kv._store[0]
    assert kv.remove([0]) == [2, 1]  # the first leaves, the last takes its place, in place
    assert kv.lengths == [4, 5] and kv._store[0] is store and kv._values[0].base is store
    assert kv.nbytes == 3 * kv.capacity * LAYOUT.bytes_per_token  # the spare row is held
    assert (kv.row(0)[0] == 3).all() and (kv.row(1)[1] == 2).all()
    kv.add_rows([_filled(2, 4)])  # a newcomer takes the spare row: no re-allocation
    assert kv._store[0] is store and kv.lengths == [4, 5, 2]
    assert (kv.row(2)[0] == 4).all() and kv.row(2)[0].shape == (2, 2, 4)
    assert (kv._values[0][2, :, 2:] == 0).all()  # no trace of the row's previous tenant (3s)
    runner = _AppendingRunner(kv)
    kv.step(runner, [7, 8, 9])
    np.testing.assert_array_equal(runner.calls[-1][2], [[4], [5], [2]])
    assert (kv.row(2)[0][:, 2] == 109).all() and kv.lengths == [5, 6, 3]
    kv.add_rows([_filled(1, 5)])  # no spare row left: one re-allocation of all four
    assert kv._store[0] is not store and kv.size == 4
    assert (kv.row(2)[0][:, :2] == 4).all() and (kv.row(3)[0] == 5).all()
    kv.remove([0, 1, 2])  # a quarter in use: re-made for the one row, memory given back
    assert len(kv._store[0]) == 1 and kv.lengths == [1] and (kv.row(0)[0] == 5).all()
    kv.remove([0])
    assert kv.size == 0 and kv.nbytes == 0


@pytest.mark.parametrize("seed", range(40))
def test_end_padded_kv_removal_keeps_every_other_row(seed):
    """Any rows leaving: each kept row's KV whole, at the place the returned order says."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 12))
    rows = [[rng.normal(size=(2, int(rng.integers(1, 9)), 4)).astype(np.float32)] * 2
            for _ in range(size)]  # fmt: skip
    kv = EndPaddedKV(LAYOUT)
    kv.add_rows(rows)
    gone = [int(j) for j in rng.choice(size, int(rng.integers(0, size + 1)), replace=False)]
    order = kv.remove(gone)
    assert sorted(order) == sorted(set(range(size)) - set(gone))
    assert kv.lengths == [rows[j][0].shape[1] for j in order]
    for place, j in enumerate(order):
        np.testing.assert_array_equal(kv.row(place)[1], rows[j][1])


def test_keys_and_values_may_differ_in_type_and_width():
    """fused-int8-kernel's buffers: fp16 keys [kv, T, hd], int8 values [kv, T, hd + 4] (each
    column's scale after its numbers): the layout takes each as its input declares, counts
    their bytes, and the batch keeps each buffer's type and width as rows come and go."""
    from types import SimpleNamespace

    def spec(name: str, width: int, kind: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, shape=["batch", 2, "past", width], type=kind)

    inputs = [
        spec("past_key_values.0.key", 8, "tensor(float16)"),
        spec("past_key_values.0.value", 12, "tensor(int8)"),
    ]
    outputs = [SimpleNamespace(name="present.0.key"), SimpleNamespace(name="present.0.value")]
    session = SimpleNamespace(get_inputs=lambda: inputs, get_outputs=lambda: outputs)
    layout = KVLayout.from_session(session)
    assert [(b.width, b.dtype) for b in layout.buffers] == [(8, np.float16), (12, np.int8)]
    assert layout.bytes_per_token == 2 * 8 * 2 + 2 * 12
    assert [a.shape for a in layout.empty(3)] == [(3, 2, 0, 8), (3, 2, 0, 12)]
    rng = np.random.default_rng(1)
    rows = []
    for length in (3, 5, 4):
        keys, values = layout.zeros(length)
        keys[:] = rng.standard_normal(keys.shape)
        values[:] = rng.integers(-127, 128, values.shape)
        rows.append([keys, values])
    kv = EndPaddedKV(layout)
    kv.add_rows(rows)
    assert kv.nbytes == 3 * kv.capacity * layout.bytes_per_token
    assert kv.remove([0]) == [2, 1]  # the last row moved into the gap
    for place, j in enumerate([2, 1]):
        for got, want in zip(kv.row(place), rows[j], strict=True):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_separate_kv_runs_each_row_alone_unpadded():
    kv = SeparateKV(LAYOUT)
    runner = _AppendingRunner()
    kv.add_rows([[np.ones((2, 3, 4), np.float32)] * 2, [np.full((2, 5, 4), 2, np.float32)] * 2])
    logits = kv.step(runner, [7, 8])
    assert logits.shape == (2, 7) and kv.lengths == [4, 6] and len(runner.calls) == 2
    for (ids, mask, positions), n, token in zip(runner.calls, (3, 5), (7, 8), strict=True):
        assert ids.tolist() == [[token]] and positions.tolist() == [[n]]
        assert mask.shape == (1, n + 1) and mask.all()
    assert kv.row(1)[0].shape == (2, 6, 4) and (kv.row(1)[0][:, 5] == 108).all()
    kv.remove([0])
    assert kv.lengths == [6] and kv.nbytes == 6 * LAYOUT.bytes_per_token


def test_prefill_runs_are_even():
    from nbresponses.runtime.scheduler import prefill_runs

    assert prefill_runs(1, 512) == [2]  # one dummy token after the real one
    assert prefill_runs(2, 512) == [2]
    assert prefill_runs(37, 512) == [38]
    assert prefill_runs(512, 512) == [512]
    assert prefill_runs(513, 512) == [512, 2]
    assert prefill_runs(1100, 64) == [64] * 17 + [12]
    for count in range(1, 300):
        runs = prefill_runs(count, 16)
        assert all(r % 2 == 0 and 2 <= r <= 16 for r in runs)
        assert sum(runs) - count in (0, 1)
    with pytest.raises(ValueError, match="even"):
        prefill_runs(10, 5)


def test_session_options_tuned_for_decode():
    import onnxruntime as ort

    from nbresponses.runtime.runner import session_options

    options = session_options(3)
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry("session.set_denormal_as_zero")  # see session_options


def test_threads_are_capped_at_the_attention_heads(tmp_path):
    """More threads than heads lets ONNX Runtime split one row's keys across threads at
    batch 1 only (flash decoding): the engine never runs so."""
    from nbresponses.models.prepared import PreparedModel
    from nbresponses.runtime.generator import exact_threads

    (tmp_path / "config.json").write_text('{"num_attention_heads": 4}')
    prepared = PreparedModel(tmp_path, {})
    assert exact_threads(prepared, 2) == 2
    with pytest.warns(UserWarning, match="capped at the model's 4 attention heads"):
        assert exact_threads(prepared, 16) == 4
    assert exact_threads(prepared, None) <= 4
