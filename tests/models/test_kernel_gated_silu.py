"""``GatedSilu`` (``kernels/gated_silu.cc``): silu(gate) * up in one node, the same bits as the
two nodes the graph had, ONNX Runtime's QuickGelu (alpha 1) and Mul, on this machine, from the
AVX-512 and the AVX2 code, for any length (the vectors' tail included) and the values that
take the logistic's edges: its clamp at +-18, infinities, NaN, signed zeros, tiny values."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.operators import operator_session
from onnx import TensorProto, helper

from nbresponses.models import kernels

ISAS = {"native": (), "avx2": ("-mno-avx512f",)}


def _sessions(isa: str):
    shape = ["rows", "width"]
    inputs = [
        helper.make_tensor_value_info("gate", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("up", TensorProto.FLOAT, shape),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)]
    ours = helper.make_node("GatedSilu", ["gate", "up"], ["out"], domain=kernels.DOMAIN)
    theirs = [
        helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
        helper.make_node("Mul", ["act", "up"], ["out"]),
    ]
    try:
        return (
            operator_session([ours], inputs, outputs, [], ISAS[isa]),
            operator_session(theirs, inputs, outputs, []),
        )
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))


def _gates(rng: np.random.Generator, count: int) -> np.ndarray:
    """Values at every scale, and the edges."""
    x = rng.standard_normal(count) * np.exp(rng.uniform(-12, 4, count))
    edges = [0.0, -0.0, 18.0, -18.0, 17.999998, -18.000002, 40.0, -40.0, 88.0, -104.0]
    edges += [np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3.4e38, -3.4e38]
    x[: min(count, len(edges))] = edges[:count]
    return x.astype(np.float32)


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_bits_of_quickgelu_and_mul(isa) -> None:
    ours, theirs = _sessions(isa)
    rng = np.random.default_rng(3)
    for rows, width in ((1, 1536), (16, 1536), (3, 37), (1, 5), (370, 3072), (2, 4097)):
        gate = _gates(rng, rows * width).reshape(rows, width)
        up = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
        up.flat[rng.integers(0, rows * width)] = np.inf  # inf * 0 = NaN, as Mul gives it
        feeds = {"gate": gate, "up": up}
        (got,), (expected,) = ours.run(None, feeds), theirs.run(None, feeds)
        np.testing.assert_array_equal(got, expected)
        # and what it stands for: silu(gate) * up, within the logistic approximation's
        # absolute error (~1e-7, scaled by gate * up) and float32's rounding
        g, u = gate.astype(np.float64), up.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            reference = g / (1 + np.exp(-g)) * u
            seen = np.isfinite(reference) & np.isfinite(got)
            error = np.abs(got[seen] - reference[seen])
            bound = 1e-6 * np.abs(reference[seen]) + 2e-7 * np.abs(g * u)[seen] + 1e-38
        assert np.all(error <= bound)
        assert np.array_equal(np.isnan(got), np.isnan(expected))


def test_gate_and_up_must_match() -> None:
    ours, _ = _sessions("native")
    with pytest.raises(Exception, match="one shape"):
        ours.run(None, {"gate": np.ones((2, 8), np.float32), "up": np.ones((2, 7), np.float32)})
