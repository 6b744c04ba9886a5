"""benchmarks/decode.py's bookkeeping: what its table reports from given timelines and prompts.

No timing is asserted: the traces are made up, the numbers follow from them exactly.
"""

from __future__ import annotations

import sys

import pytest
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling imports; removed at once, since
try:  # benchmarks/ has modules whose names (frames, protocol, ...) would shadow others
    import decode
    import workloads
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def test_metrics_from_traces() -> None:
    # request 0 arrives at 0, first token at 0.1, then one token per 0.01 s (10 tokens in all);
    # request 1 arrives at 0.05, first at 0.3, a 2-token step at 0.35 (speculation), ends 0.40
    first = [(0.1 + 0.01 * i, 1) for i in range(10)]
    second = [(0.3, 1), (0.35, 2), (0.40, 1)]
    m = decode.metrics([(0.0, first, list(range(10))), (0.05, second, [1, 2, 3, 4])])
    assert m["ttft_p50"] == pytest.approx((0.1 + 0.25) / 2)
    assert m["ttft_p95"] == pytest.approx(0.1 + 0.95 * 0.15)
    assert m["decode_tps"] == pytest.approx(9 / 0.09)  # tokens after the first / their time
    assert m["aggregate_tps"] == pytest.approx(14 / 0.40)  # tokens of steps, not steps
    assert m["steady_tps"] == pytest.approx(3 / 0.10)  # after 0.3, every row has its first


def test_scenarios_add_a_staggered_run_at_the_top_concurrency() -> None:
    args = decode.argparse.Namespace(concurrency=[16, 1, 4], stagger_ms=50.0)
    labels = [s.label for s in decode.scenarios(args)]
    assert labels == ["x1", "x4", "x16", "x16 staggered"]
    args.stagger_ms = 0
    assert [s.label for s in decode.scenarios(args)] == ["x1", "x4", "x16"]


def test_workloads_are_cold_mixed_and_grounded(tokenizer) -> None:
    chat, grounded = workloads.load_workloads(tokenizer, ["chat", "grounded"])
    for w in (chat, grounded):
        assert len(w.mixed) == 16 and len({tuple(p) for p in w.mixed}) == 16  # all different
        assert w.take(1) == [w.single]
        four = w.take(4)
        assert len({tuple(p) for p in four}) == 4 and len({len(p) for p in four}) == 4
        assert w.take(16) == w.mixed
    assert max(map(len, chat.mixed)) > 4 * min(map(len, chat.mixed))  # mixed lengths
    assert min(map(len, grounded.mixed)) > 200  # a text of a few hundred tokens to work on
    assert workloads.TEXTS[0].split(". ")[0] in tokenizer.decode(grounded.single)


def test_the_steady_rate_is_set_against_the_own_batch_1_decode(capsys) -> None:
    # the x16 aggregate carries the prompts' prefill; x1's decode and the steady rate do not
    def sampled(n: int, **metrics: float) -> decode.Sampled:
        base = dict.fromkeys(("ttft_p50", "ttft_p95", "aggregate_tps", "steady_tps"), 1.0)
        case = decode.Case("engine fused-q8", "chat", decode.Scenario(n), lambda: [])
        return decode.Sampled(case, {**base, **metrics}, [1, 2, 3])

    samples = [
        sampled(1, decode_tps=160.0),
        sampled(16, decode_tps=50.0, aggregate_tps=640.0, steady_tps=960.0),
    ]
    chat = workloads.Workload("chat", [1, 2], [[1, 2]] * 16)
    decode.report(samples, "fused-q8", [chat], 128)
    out = capsys.readouterr().out
    assert "engine fused-q8 chat x16: once all are decoding 960 tok/s (6.00x own x1)" in out
    assert "| 640.0 | 4.00x |" in out  # the aggregate, against the same x1
