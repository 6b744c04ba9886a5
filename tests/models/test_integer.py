"""The integer recipe's matrix product (``fused._IntegerGraph``) and its smoothing, one operator
at a time, against an independent numpy computation of the same quantization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from nbresponses.models.fused import OPSET, _IntegerGraph, _NBitsGraph
from nbresponses.models.smoothing import Smoothing

K, N = 96, 40


def _session(graph: _IntegerGraph, output: str):
    import onnxruntime as ort

    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "linear",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", K])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["B", "S", N])],
            graph.initializers,
        ),
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options)
    return lambda x: session.run([output], {"x": x})[0]


def _reference(x: np.ndarray, weight: np.ndarray, limit: int = 127) -> np.ndarray:
    """The same quantization in numpy: int8 weights per column, each row of x symmetric on
    [-127, 127] with round-half-to-even, products summed exactly in int64."""
    w_scale = np.abs(weight).max(axis=0) / np.float32(limit)
    w_q = np.clip(np.rint(weight / w_scale), -limit, limit).astype(np.int64)
    x_scale = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    x_q = np.clip(np.rint(x / x_scale), -127, 127).astype(np.int64)
    return (x_q @ w_q).astype(np.float64) * x_scale * w_scale


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((K, N)) * 0.1).astype(np.float32)
    x = rng.standard_normal((2, 7, K)).astype(np.float32)
    x[..., 5] *= 30  # an outlier channel, as the norms make them
    return x, weight


def test_the_product_is_the_numpy_quantization(data) -> None:
    x, weight = data
    graph = _IntegerGraph()
    run = _session(graph, graph.linear("x", weight, name="lin"))
    got, expected = run(x), _reference(x, weight)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()  # fp32 scaling only
    # and it is a matrix product: within the quantization error of x @ weight (measured 2.2%
    # of the mean |output| here, with one channel 30x the others)
    exact = x @ weight
    assert np.abs(got - exact).mean() < 0.05 * np.abs(exact).mean()


@pytest.mark.parametrize("outliers", [0, 4])
def test_a_row_gets_the_same_bits_alone_and_among_others(data, outliers: int) -> None:
    """With outliers too: their fp32 product must give a row the same bits at any row count."""
    x, weight = data
    graph = _IntegerGraph(outliers=outliers)
    peaks = np.abs(x).max(axis=(0, 1))
    run = _session(graph, graph.linear("x", weight, name="lin", peaks=peaks))
    together = run(x)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            assert np.array_equal(run(x[b : b + 1, s : s + 1])[0, 0], together[b, s])
    # ... and among more rows of other values (a batch of 64)
    rng = np.random.default_rng(4)
    many = np.concatenate([x[:1, :1], rng.standard_normal((1, 63, K)).astype(np.float32)], 1)
    assert np.array_equal(run(many)[0, 0], together[0, 0])


def test_a_row_of_zeros_gives_zeros(data) -> None:
    x, weight = data
    graph = _IntegerGraph()
    run = _session(graph, graph.linear("x", weight, name="lin"))
    x = x.copy()
    x[0, 2] = 0
    got = run(x)
    assert np.array_equal(got[0, 2], np.zeros(N, np.float32))
    assert np.isfinite(got).all()


def test_outlier_channels_are_kept_apart_in_fp32(data) -> None:
    x, weight = data
    peaks = np.abs(x).max(axis=(0, 1))
    graph = _IntegerGraph(outliers=4)
    run = _session(graph, graph.linear("x", weight, name="lin", peaks=peaks))
    apart = np.sort(np.argsort(-peaks, kind="stable")[:4])
    rest = np.setdiff1d(np.arange(K), apart)
    expected = _reference(x[..., rest], weight[rest]) + (
        x[..., apart].astype(np.float64) @ weight[apart].astype(np.float64)
    )
    got = run(x)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    exact = x @ weight
    single = _reference(x, weight)
    assert np.abs(got - exact).mean() < 0.5 * np.abs(single - exact).mean()  # what it is for


def test_seven_bit_weights_leave_no_pair_to_saturate(data) -> None:
    _, weight = data
    q, scale = _IntegerGraph(weight_bits=7).quantize_weight(weight)
    assert q.dtype == np.int8 and np.abs(q).max() == 63
    assert 255 * 63 * 2 < 2**15  # vpmaddubsw's int16 pair sums
    assert np.allclose(q * scale, weight, atol=scale.max())


def test_the_smoothing_factor() -> None:
    peaks = np.array([4.0, 0.0, 1.0, 9.0], np.float32)
    weights = np.array([1.0, 2.0, 0.0, 4.0], np.float32)
    factor = Smoothing({"lin": peaks}, alpha=0.5).factor("lin", weights)
    assert np.allclose(factor, [2.0, 1.0, 1.0, 1.5])  # sqrt(a / w); 1 where a or w is 0
    factor = Smoothing({"lin": peaks}, alpha=0.75).factor("lin", weights)
    assert np.isclose(factor[0], 4.0**0.75 / 1.0**0.25)


def test_products_named_in_blocks_are_the_8_bit_block_product(data) -> None:
    """``blocks`` (the recipe keeps the down projections so): that product is fused-q8's
    MatMulNBits, the same weights and bits as an _NBitsGraph's, and the other products stay
    integer."""
    x, weight = data
    mixed = _IntegerGraph(outliers=4, blocks=("/down",))
    down = mixed.linear("x", weight, name="layer/down", peaks=np.abs(x).max(axis=(0, 1)))
    assert [n.op_type for n in mixed.nodes] == ["MatMulNBits"]
    blocks = _NBitsGraph(8)
    reference = blocks.linear("x", weight, name="layer/down")
    assert np.array_equal(_session(mixed, down)(x), _session(blocks, reference)(x))
    integer = _IntegerGraph(blocks=("/down",))
    out = integer.linear("x", weight, name="layer/qkv")
    assert "MatMulIntegerToFloat" in {n.op_type for n in integer.nodes}
    plain = _IntegerGraph()
    expected = _session(plain, plain.linear("x", weight, name="layer/qkv"))(x)
    assert np.array_equal(_session(integer, out)(x), expected)
