"""``SkipNorm`` (``kernels/skip_norm.cc``): RMSNorm of x + skip and the sum, in one node.

Checked against its definition computed independently here in numpy (each float32 operation
rounded as the C++ rounds it: the 16 lanes' fused multiply-adds, the fixed tree, the division,
the square root, the two products), bit for bit, from the AVX-512 and the AVX2 code, for widths
with and without a tail shorter than the lanes; rows alone equal rows together; and within
float32's rounding of a float64 RMSNorm and of ONNX Runtime's own SkipSimplifiedLayerNormalization.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.operators import operator_session
from onnx import TensorProto, helper

from nbresponses.models import kernels

ISAS = {"native": (), "avx2": ("-mno-avx512f",)}
EPSILON = np.float32(1e-6)
LANES = 16
f32 = np.float32


def _session(isa: str, width: int, gamma: np.ndarray, *, skip: bool, total: bool):
    shape = ["rows", width]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if skip:
        inputs.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, shape))
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)]
    if total:
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, shape))
    node = helper.make_node(
        "SkipNorm",
        ["x", "skip" if skip else "", "gamma"],
        ["out", "sum"] if total else ["out"],
        domain=kernels.DOMAIN,
        epsilon=float(EPSILON),
    )
    weights = [helper.make_tensor("gamma", TensorProto.FLOAT, [width], gamma)]
    try:
        return operator_session([node], inputs, outputs, weights, ISAS[isa])
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))


def _definition(x: np.ndarray, skip: np.ndarray | None, gamma: np.ndarray):
    """(out, sum) as the operator defines them, one row at a time in numpy."""
    s = x + skip if skip is not None else x.copy()  # float32 adds
    outs = np.empty_like(s)
    for r, row in enumerate(s):
        lanes = np.zeros(LANES, f32)
        for begin in range(0, row.size, LANES):
            block = row[begin : begin + LANES].astype(np.float64)
            n = block.size
            # fma(s, s, lane): s * s is exact in float64, the sum rounded once to float32
            lanes[:n] = (block * block + lanes[:n].astype(np.float64)).astype(f32)
        width = LANES // 2
        while width:
            lanes[:width] = lanes[:width] + lanes[width : 2 * width]
            width //= 2
        mean = f32(lanes[0] / f32(row.size))
        inv = f32(1) / np.sqrt(f32(mean + EPSILON))
        outs[r] = (row * inv) * gamma
    return outs, s


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_definition_bit_for_bit(isa) -> None:
    rng = np.random.default_rng(7)
    for width in (576, 1024, 37, 5, 100):
        gamma = rng.uniform(0.2, 3, width).astype(f32)
        for skip, total in ((True, True), (True, False), (False, False)):
            session = _session(isa, width, gamma, skip=skip, total=total)
            for rows in (1, 16, 130):  # 130 x 576: over the size the pool takes
                scale = np.exp(rng.uniform(-8, 6, (rows, 1)))
                x = (rng.standard_normal((rows, width)) * scale).astype(f32)
                feeds = {"x": x}
                y = None
                if skip:
                    y = (rng.standard_normal((rows, width)) * scale).astype(f32)
                    feeds["skip"] = y
                got = session.run(None, feeds)
                out, s = _definition(x, y, gamma)
                np.testing.assert_array_equal(got[0], out)
                if total:
                    np.testing.assert_array_equal(got[1], s)
                # each row alone: the same bits
                alone = [
                    session.run(None, {k: v[i : i + 1] for k, v in feeds.items()})[0]
                    for i in range(0, rows, max(1, rows // 5))
                ]
                np.testing.assert_array_equal(np.concatenate(alone), got[0][:: max(1, rows // 5)])
                # and what it stands for
                s64 = s.astype(np.float64)
                reference = s64 / np.sqrt((s64 * s64).mean(-1, keepdims=True) + 1e-6) * gamma
                np.testing.assert_allclose(got[0], reference, rtol=2e-6, atol=1e-30)


def test_within_rounding_of_onnx_runtimes_norm() -> None:
    rng = np.random.default_rng(8)
    width = 576
    gamma = rng.uniform(0.2, 3, width).astype(f32)
    ours = _session("native", width, gamma, skip=True, total=True)
    shape = ["rows", width]
    theirs = operator_session(
        [
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                ["x", "skip", "gamma"],
                ["out", "", "", "sum"],
                domain="com.microsoft",
                epsilon=float(EPSILON),
            )
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "skip")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("out", "sum")],
        [helper.make_tensor("gamma", TensorProto.FLOAT, [width], gamma)],
    )
    feeds = {n: (rng.standard_normal((16, width)) * 4).astype(f32) for n in ("x", "skip")}
    (out, total), (their_out, their_total) = ours.run(None, feeds), theirs.run(None, feeds)
    np.testing.assert_array_equal(total, their_total)
    np.testing.assert_allclose(out, their_out, rtol=2e-6)


def test_shapes_must_agree() -> None:
    session = _session("native", 8, np.ones(8, f32), skip=True, total=False)
    with pytest.raises(Exception, match="SkipNorm"):
        session.run(None, {"x": np.ones((2, 8), f32), "skip": np.ones((3, 8), f32)})
