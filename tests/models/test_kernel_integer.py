"""Our integer-product operators (``nbresponses.models.kernels``): ``QuantizeRows`` and
``OutlierProduct``, what ``fused._IntegerGraph(quantizer="kernel")`` puts in a graph.

``QuantizeRows`` promises the very bits of the standard operators it replaces (a mask, Gather,
Abs, ReduceMax, Mul, blocked QuantizeLinear): checked here against ONNX Runtime running those.
``OutlierProduct`` promises each row its own fixed fma chain: checked against a float64 product
(fp32 rounding) and bit for bit alone against batched. Both with the AVX-512 code where the CPU
has it and the AVX2 code everywhere.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.operators import operator_session as _session
from onnx import TensorProto, helper

from nbresponses.models import kernels

ISAS = {"native": (), "avx2": ("-mno-avx512f",)}


@pytest.fixture(params=list(ISAS))
def flags(request) -> tuple[str, ...]:
    try:
        kernels.library(flags=ISAS[request.param])
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))
    return ISAS[request.param]


def _value(name: str, dtype: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _standard_quantizer(width: int, apart: np.ndarray):
    """The integer graph's ops form (fused._IntegerGraph with quantizer="ops")."""
    keep = np.ones(width, np.float32)
    keep[apart] = 0
    inits = [
        onnx.numpy_helper.from_array(keep, "keep"),
        onnx.numpy_helper.from_array(apart.astype(np.int64), "apart"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "last"),
        onnx.numpy_helper.from_array(np.array(1 / 127, np.float32), "inv127"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "one"),
        onnx.numpy_helper.from_array(np.array(128, np.uint8), "zp"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "keep"], ["rest"]),
        helper.make_node("Gather", ["x", "apart"], ["picked"], axis=-1),
        helper.make_node("Abs", ["rest"], ["abs"]),
        helper.make_node("ReduceMax", ["abs", "last"], ["peak"], keepdims=1),
        helper.make_node("Mul", ["peak", "inv127"], ["scale"]),
        helper.make_node("Shape", ["x"], ["rows"], end=-1),
        helper.make_node("Concat", ["rows", "one"], ["scale_shape"], axis=0),
        helper.make_node("Expand", ["zp", "scale_shape"], ["zps"]),
        helper.make_node(
            "QuantizeLinear", ["rest", "scale", "zps"], ["q"], axis=-1, block_size=width
        ),
    ]
    shape = ["b", "s", width]
    return _session(
        nodes,
        [_value("x", TensorProto.FLOAT, shape)],
        [
            _value("q", TensorProto.UINT8, shape),
            _value("scale", TensorProto.FLOAT, ["b", "s", 1]),
            _value("picked", TensorProto.FLOAT, ["b", "s", len(apart)]),
        ],
        inits,
    )


def _quantize_rows(width: int, apart: np.ndarray, flags=()):
    shape = ["b", "s", width]
    return _session(
        [
            helper.make_node(
                "QuantizeRows", ["x", "apart"], ["q", "scale", "picked"], domain=kernels.DOMAIN
            )
        ],
        [_value("x", TensorProto.FLOAT, shape)],
        [
            _value("q", TensorProto.UINT8, shape),
            _value("scale", TensorProto.FLOAT, ["b", "s", 1]),
            _value("picked", TensorProto.FLOAT, ["b", "s", len(apart)]),
        ],
        [onnx.numpy_helper.from_array(apart.astype(np.int64), "apart")],
        flags,
    )


def _rows(width: int, apart: np.ndarray) -> np.ndarray:
    """Rows as the layers give them: smooth ones, a few huge channels (some kept apart, some
    not), exact halves of the quantization step (round half to even), a row of zeros."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((3, 7, width)).astype(np.float32)
    x[0, 1] *= 40
    x[1, 2, apart] = 300.0  # the peak is among the channels kept apart: not counted
    x[1, 3, 5] = -500.0  # a peak among the others
    x[2, 0] = 0.0
    x[2, 1] = 0.0
    x[2, 1, :8] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -127]  # steps of exactly ~1
    x[2, 2] = np.float32(1e-30) * rng.standard_normal(width).astype(np.float32)  # tiny scale
    return x


@pytest.mark.parametrize("width,outliers", [(576, 16), (576, 0), (37, 3), (1536, 16)])
def test_quantize_rows_gives_the_standard_operators_bits(flags, width, outliers) -> None:
    apart = np.sort(np.random.default_rng(1).choice(width, outliers, replace=False))
    x = _rows(width, apart)
    standard = _standard_quantizer(width, apart).run(None, {"x": x})
    ours = _quantize_rows(width, apart, flags).run(None, {"x": x})
    for name, a, b in zip(("quantized", "scale", "picked"), standard, ours, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name  # bits, -0.0 and NaN too
    # and what the formula says, independently (a row of zeros has scale 0: 0 / 0 quantizes
    # to 0 as in MLAS, and its product is multiplied by that 0)
    q, scale, picked = ours
    keep = np.ones(width, bool)
    keep[apart] = False
    peak = np.abs(x[..., keep]).max(axis=-1, keepdims=True)
    np.testing.assert_array_equal(scale, peak * np.float32(1 / 127))
    np.testing.assert_array_equal(picked, x[..., apart])
    assert scale[2, 0] == 0
    assert (q[scale[..., 0] > 0][:, apart] == 128).all()
    expected = np.clip(np.rint(np.where(keep, x[0, 1], 0) / scale[0, 1]), -128, 127) + 128
    np.testing.assert_array_equal(q[0, 1], expected.astype(np.uint8))


def test_quantize_rows_of_one_row_and_of_many_agree(flags) -> None:
    """A decode step (one row, computed in the calling thread) and a prompt's rows (the pool)."""
    apart = np.array([3, 9])
    x = _rows(64, apart)
    session = _quantize_rows(64, apart, flags)
    batched = session.run(None, {"x": x})
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            alone = session.run(None, {"x": x[b : b + 1, s : s + 1]})
            for a, c in zip(alone, batched, strict=True):
                assert np.array_equal(a[0, 0].view(np.uint8), c[b, s].view(np.uint8))


def test_quantize_rows_refuses_a_channel_outside_the_row(flags) -> None:
    session = _quantize_rows(8, np.array([8]), flags)
    with pytest.raises(Exception, match="outside x's last axis"):
        session.run(None, {"x": np.ones((1, 1, 8), np.float32)})


def _outlier_product(width: int, outliers: int | str, flags=()):
    return _session(
        [
            helper.make_node(
                "OutlierProduct", ["base", "picked", "weight"], ["y"], domain=kernels.DOMAIN
            )
        ],
        [
            _value("base", TensorProto.FLOAT, ["b", "s", width]),
            _value("picked", TensorProto.FLOAT, ["b", "s", outliers]),
            _value("weight", TensorProto.FLOAT, ["k" if outliers == "n" else outliers, width]),
        ],
        [_value("y", TensorProto.FLOAT, ["b", "s", width])],
        [],
        flags,
    )


@pytest.mark.parametrize("width,outliers", [(960, 16), (100, 16), (64, 1), (3072, 5)])
def test_outlier_product_adds_the_channels_products(flags, width, outliers) -> None:
    rng = np.random.default_rng(width + outliers)
    base = rng.standard_normal((2, 5, width)).astype(np.float32)
    picked = (30 * rng.standard_normal((2, 5, outliers))).astype(np.float32)
    weight = (0.05 * rng.standard_normal((outliers, width))).astype(np.float32)
    session = _outlier_product(width, outliers, flags)
    (y,) = session.run(None, {"base": base, "picked": picked, "weight": weight})
    exact = base.astype(np.float64) + picked.astype(np.float64) @ weight.astype(np.float64)
    terms = np.abs(picked).astype(np.float64) @ np.abs(weight).astype(np.float64) + np.abs(base)
    assert (np.abs(y - exact) <= 4 * (outliers + 1) * 2**-24 * terms).all()
    for b in range(2):  # each row its own chain: the same bits alone
        for s in range(5):
            (alone,) = session.run(
                None,
                {
                    "base": base[b : b + 1, s : s + 1],
                    "picked": picked[b : b + 1, s : s + 1],
                    "weight": weight,
                },
            )
            assert np.array_equal(alone[0, 0], y[b, s])


def test_outlier_product_refuses_mismatched_shapes(flags) -> None:
    session = _outlier_product(8, "n", flags)  # the shapes' check is the operator's
    with pytest.raises(Exception, match="OutlierProduct"):
        session.run(
            None,
            {
                "base": np.ones((1, 1, 8), np.float32),
                "picked": np.ones((1, 1, 3), np.float32),
                "weight": np.ones((2, 8), np.float32),
            },
        )
