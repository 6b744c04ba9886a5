"""Our ``GroupProduct`` operator (``nbresponses.models.kernels``), what
``fused._IntegerGraph(grouped=...)`` puts in a graph for the down projections.

It promises: the product of the group-quantized rows and weights (checked against an
independent float64 computation of the same quantization, and loosely against the plain fp32
product), each row's output its own fixed chain (bit for bit alone and batched, at any number of
rows), and the same bits from the VNNI code and the byte products without it (AVX2's, and
AVX-512's before VNNI).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.operators import operator_session
from onnx import TensorProto, helper

from nbresponses.models import fused, kernels

# the build for this CPU; AVX2's code; AVX-512's without VNNI (the AVX2 build where the CPU has
# no AVX-512)
ISAS = {"native": (), "avx2": ("-mno-avx512f",), "no-vnni": ("-mno-avx512vnni",)}


def _library(flags: tuple[str, ...]) -> None:
    try:
        kernels.library(flags=flags)
    except kernels.KernelsUnavailable as error:
        pytest.skip(str(error))


def _session(weight: np.ndarray, peaks: np.ndarray | None, group: int, flags=(), outliers=16):
    """A graph of one grouped product, built by the fused builder itself."""
    g = fused._IntegerGraph(outliers=outliers, quantizer="kernel", grouped=("/down",), group=group)
    out = g.linear("x", weight, name="layers.0/down", peaks=peaks)
    assert [node.op_type for node in g.nodes] == ["GroupProduct"]
    return operator_session(
        g.nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", "k"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["b", "s", weight.shape[1]])],
        g.initializers,
        flags,
    )


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to the nearest bfloat16 (ties to even), as fp32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def _reference(x: np.ndarray, weight: np.ndarray, apart: np.ndarray, group: int) -> np.ndarray:
    """The operator's arithmetic written out independently in numpy: symmetric int8 weights
    per group and column (the scale rounded to bfloat16 by hand: the top 16 bits of the fp32,
    rounded half to even), int8 rows per group (x / scale rounded half to even), integer sums,
    the scales applied in float64, the apart channels (their weights in bfloat16) in float64."""
    k, n = weight.shape
    rest = weight.astype(np.float64).copy()
    rest[apart] = 0
    w_groups = rest.reshape(k // group, group, n)
    w_scale = _bfloat16((np.abs(w_groups).max(axis=1) / 127).astype(np.float32))
    w_scale[w_scale == 0] = 1
    w_int = np.clip(np.rint(w_groups.astype(np.float32) / w_scale[:, None, :]), -127, 127)
    rows = x.reshape(-1, k).copy()
    picked = rows[:, apart].astype(np.float64)
    rows[:, apart] = 0
    x_groups = rows.reshape(len(rows), k // group, group)
    x_scale = np.abs(x_groups).max(axis=2) * np.float32(1 / 127)  # fp32, as the operator
    with np.errstate(divide="ignore", invalid="ignore"):
        x_int = np.clip(np.rint(x_groups / x_scale[:, :, None]), -127, 127)
    x_int[x_scale == 0] = 0
    sums = np.einsum("rgk,gkn->rgn", x_int.astype(np.int64), w_int.astype(np.int64))
    scaled = sums * (x_scale[:, :, None].astype(np.float64) * w_scale[None].astype(np.float64))
    out = scaled.sum(axis=1) + picked @ _bfloat16(weight[apart]).astype(np.float64)
    return out.reshape(*x.shape[:-1], n)


def _case(k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    weight[3] *= 20  # a large weight row: its groups' scales, not the others'
    peaks = rng.random(k).astype(np.float32)
    return weight, peaks


def _rows(k: int, apart: np.ndarray, shape=(3, 7), seed: int = 1) -> np.ndarray:
    """Rows as a down projection's input: mostly small, a few huge channels (kept apart or
    not), a group of zeros, exact halves of a quantization step, a row of zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape, k)).astype(np.float32)
    x[0, 1] *= 40
    x[1, 2, apart] = 300.0
    x[1, 3, 5] = -500.0
    x[2, 0] = 0.0
    x[2, 1, :32] = 0.0
    x[2, 2, :8] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -127]
    return x


SHAPES = [(1536, 576, 64), (1536, 576, 32), (128, 37, 32), (256, 100, 128)]


@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("isa", list(ISAS))
def test_the_product_of_the_groups_as_numpy_computes_it(k, n, group, isa) -> None:
    _library(ISAS[isa])
    weight, peaks = _case(k, n)
    apart = np.sort(np.argsort(-peaks, kind="stable")[:16])
    x = _rows(k, apart)
    got = _session(weight, peaks, group, ISAS[isa]).run(None, {"x": x})[0]
    want = _reference(x, weight, apart, group)
    # fp32 rounding of a chain of K / group terms: relative to the terms' magnitude
    magnitude = np.abs(x).reshape(-1, k) @ np.abs(weight).astype(np.float64)
    assert np.all(np.abs(got - want) <= 1e-5 * magnitude.reshape(got.shape) + 1e-30)
    # and on plain rows it is the product it stands for, within 8-bit quantization (the large
    # weight row coarsens its groups)
    smooth = np.random.default_rng(9).standard_normal((2, 5, k)).astype(np.float32)
    got = _session(weight, peaks, group, ISAS[isa]).run(None, {"x": smooth})[0]
    exact = smooth.astype(np.float64) @ weight.astype(np.float64)
    assert np.abs(got - exact).max() <= 0.05 * np.abs(exact).max()  # a wrong layout: ~100%


def test_constant_weights_read_from_their_copy_give_the_inputs_bits() -> None:
    """A graph's constant weights are read from copies in 2 MB pages, shared by sessions with
    the same weights: the bits of the same weights fed as inputs (read where they are), and a
    session keeps its copies while another that shares them is closed."""
    import gc

    import onnxruntime as ort

    _library(())
    weight, peaks = _case(1536, 576, seed=3)
    apart = np.sort(np.argsort(-peaks, kind="stable")[:16])
    x = _rows(1536, apart)
    g = fused._IntegerGraph(outliers=16, quantizer="kernel", grouped=("/down",), group=64)
    out = g.linear("x", weight, name="layers.0/down", peaks=peaks)
    names = set(g.nodes[0].input[1:])
    constants = [t for t in g.initializers if t.name in names]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", "k"])]
    result = [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["b", "s", 576])]
    first = operator_session(g.nodes, inputs, result, g.initializers)
    second = operator_session(g.nodes, inputs, result, g.initializers)
    fed = operator_session(
        g.nodes,
        inputs + [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in constants],
        result,
        [t for t in g.initializers if t.name not in names or t.name == g.nodes[0].input[1]],
    )
    feeds = {"x": ort.OrtValue.ortvalue_from_numpy(x)}
    for t in constants:
        if t.name == g.nodes[0].input[1]:
            continue  # the apart channels' indices stay an initializer
        raw = np.frombuffer(
            t.raw_data, np.uint16 if t.data_type == TensorProto.BFLOAT16 else np.uint8
        )
        feeds[t.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            raw.reshape(tuple(t.dims)).copy(), t.data_type
        )
    (want,) = fed.run_with_ort_values([out], feeds)
    want = want.numpy()
    assert np.array_equal(first.run(None, {"x": x})[0].view(np.uint32), want.view(np.uint32))
    del first
    gc.collect()
    for _ in range(2):
        assert np.array_equal(second.run(None, {"x": x})[0].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("k,n,group", SHAPES[:1] + SHAPES[2:3])
def test_a_row_is_the_same_bits_alone_batched_and_without_vnni(k, n, group) -> None:
    _library(ISAS["avx2"])
    _library(ISAS["no-vnni"])
    weight, peaks = _case(k, n, seed=2)
    apart = np.sort(np.argsort(-peaks, kind="stable")[:16])
    # over two blocks of rows, in the thread pool
    x = _rows(k, apart, shape=(3, 130), seed=3).reshape(1, 390, k)
    native = _session(weight, peaks, group)
    whole = native.run(None, {"x": x})[0]
    prompts = ((0, 1), (5, 6), (64, 70), (261, 262), (0, 48), (40, 110), (260, 390))
    steps = ((100, 108), (200, 212), (300, 316))  # 2-4 row tiles: the next tile's prefetch shared
    for start, stop in (*prompts, *steps):
        part = native.run(None, {"x": x[:, start:stop]})[0]
        assert np.array_equal(part, whole[:, start:stop])
    for isa in ("avx2", "no-vnni"):
        plain = _session(weight, peaks, group, ISAS[isa]).run(None, {"x": x})[0]
        assert np.array_equal(plain, whole), isa


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_largest_sums_do_not_saturate(isa) -> None:
    """Every weight and every row value at the int8 grid's edge (+-127 after quantization), with
    signs that make each product +127 x 127 (or each one -127 x 127 in the other columns): the
    AVX2 code multiplies bytes in pairs into int16 (2 x 127 x 127 = 32,258, just below its limit),
    so a pair taken the wrong way round (an unsigned 255 by 127) would saturate. Exact sums, the
    VNNI code's bits."""
    _library(ISAS[isa])
    k, n, group = 256, 48, 64
    signs = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)
    weight = np.outer(signs, np.where(np.arange(n) % 2 == 0, 1.0, -1.0)).astype(np.float32)
    weight *= np.float32(0.05)
    apart = np.arange(16)  # the largest peaks: the first 16 channels
    peaks = np.linspace(1.0, 0.5, k).astype(np.float32)
    x = np.repeat(signs[None, None], 5, axis=1) * np.float32(3.0)  # 1 x 5 rows
    x[0, 1] *= -1.0  # a row of the opposite signs: every product -127 x 127
    got = _session(weight, peaks, group, ISAS[isa]).run(None, {"x": x})[0]
    want = _reference(x, weight, apart, group)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    _library(ISAS["native"])
    native = _session(weight, peaks, group).run(None, {"x": x})[0]
    assert np.array_equal(got.view(np.uint32), native.view(np.uint32))


def _halves_session(weight: np.ndarray, peaks: np.ndarray, group: int, flags=()):
    """The grouped product writing the two halves of its columns as two outputs, as the fused
    builder gives the MLP's gate and up (``linear_halves``)."""
    g = fused._IntegerGraph(outliers=16, quantizer="kernel", grouped=("/gate_up",), group=group)
    first, second = g.linear_halves("x", weight, name="layers.0/gate_up", split="s", peaks=peaks)
    assert [node.op_type for node in g.nodes] == ["GroupProduct"]  # no Split
    half = weight.shape[1] // 2
    return operator_session(
        g.nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", "k"])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", "s", half])
            for name in (first, second)
        ],
        g.initializers,
        flags,
    )


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("k,n", [(576, 3072), (128, 96), (256, 32)])
def test_the_halves_are_the_products_columns(k, n, isa) -> None:
    """Gate and up written apart: the two outputs are the single output's two halves, bit for
    bit, for one row and a prompt's run (tiles of six vectors and of three, halves that part
    inside a tile)."""
    _library(ISAS[isa])
    weight, peaks = _case(k, n, seed=6)
    apart = np.sort(np.argsort(-peaks, kind="stable")[:16])
    whole_session = _session(weight, peaks, 64, ISAS[isa])
    halves = _halves_session(weight, peaks, 64, ISAS[isa])
    rows = _rows(k, apart, shape=(3, 75), seed=7)
    for x in (rows[:1, :1], rows[:1, :2], rows[:2]):
        whole = whole_session.run(None, {"x": x})[0]
        first, second = halves.run(None, {"x": x})
        np.testing.assert_array_equal(first, whole[..., : n // 2])
        np.testing.assert_array_equal(second, whole[..., n // 2 :])


def test_halves_that_part_inside_a_vector_keep_the_split() -> None:
    g = fused._IntegerGraph(outliers=16, quantizer="kernel", grouped=("/gate_up",), group=64)
    weight, peaks = _case(128, 48, seed=8)  # halves of 24 columns
    g.linear_halves("x", weight, name="layers.0/gate_up", split="s", peaks=peaks)
    assert [node.op_type for node in g.nodes] == ["GroupProduct", "Split"]


def test_without_outliers_and_without_peaks() -> None:
    _library(())
    weight, _ = _case(256, 48, seed=4)
    x = _rows(256, np.zeros(0, np.int64), shape=(3, 5), seed=5)
    got = _session(weight, None, 64).run(None, {"x": x})[0]
    want = _reference(x, weight, np.zeros(0, np.int64), 64)
    magnitude = np.abs(x).reshape(-1, 256) @ np.abs(weight).astype(np.float64)
    assert np.all(np.abs(got - want) <= 1e-5 * magnitude.reshape(got.shape))


def test_bad_inputs_are_refused_with_the_operators_message() -> None:
    import onnxruntime as ort

    _library(())
    weight, peaks = _case(128, 32)
    session = _session(weight, peaks, 32)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.RuntimeException, match="K a multiple"):
        session.run(None, {"x": np.zeros((1, 2, 96), np.float32)})


def test_the_builder_refuses_groups_without_the_kernel_quantizer() -> None:
    with pytest.raises(ValueError, match="quantizer='kernel'"):
        fused._IntegerGraph(grouped=("/down",))
    with pytest.raises(ValueError, match="multiple of 4"):
        fused._IntegerGraph(quantizer="kernel", grouped=("/down",), group=30)


def test_a_width_the_groups_do_not_divide_stays_in_8_bit_blocks() -> None:
    g = fused._IntegerGraph(outliers=16, quantizer="kernel", grouped=("/down",), group=64)
    weight, peaks = _case(96, 32)
    g.linear("x", weight, name="layers.0/down", peaks=peaks)
    assert [node.op_type for node in g.nodes] == ["MatMulNBits"]


# a group (64 channels) by 16 columns in fp32 is 4,096 bytes; the weight below is 10 groups
# by 13 vectors of 16 columns (200 padded to 208)
@pytest.mark.parametrize("piece_bytes", [4096, 5 * 4096, 3 * 13 * 4096])
def test_the_weights_quantized_in_pieces_are_the_weights_in_one(piece_bytes, monkeypatch) -> None:
    """The builder quantizes a weight in pieces (``fused.PIECE_BYTES``, over the cores): cut
    into one group by one vector of columns, one group by five vectors (a short last piece)
    or three groups by every vector (a short last piece), the graph's weights are the bytes of
    one piece (whose product the tests above check against numpy); the apart channels in
    several pieces, at their edges, and a padded last vector."""

    def weights(piece: int) -> list[bytes]:
        monkeypatch.setattr(fused, "PIECE_BYTES", piece)
        g = fused._IntegerGraph(outliers=16, quantizer="kernel", grouped=("/down",), group=64)
        g.linear("x", weight, name="layers.0/down", peaks=peaks)
        return [t.SerializeToString() for t in g.initializers]

    weight, peaks = _case(640, 200)
    peaks[[0, 63, 64, 300, 639]] = 10  # apart channels at the pieces' edges
    whole = weights(1 << 40)
    assert weights(piece_bytes) == whole
