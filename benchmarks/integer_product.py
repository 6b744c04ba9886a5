"""fused-int8's product, one operator group at a time: each form of the per-row quantization
and of the outlier channels' product, checked bit for bit (rows alone against rows together)
and timed at 1, 16 and 370 rows (ONNX Runtime, the engine's session options).

Row quantization (``fused._IntegerGraph._integer_product``):
- ``divide``: x / scale, then a per-tensor QuantizeLinear of the quotient (PREPARE_VERSION 5);
- ``blocked``: one QuantizeLinear blocked along the row (the row its one block), with the zero
  points made once per run (the graph shares them between products), what the builder writes;
- ``alone``: the integer product with its input already quantized (the floor).

Outlier channels (``fused._IntegerGraph.linear``, 16 channels of 576 apart):
- ``integer``: a second integer product with its own row scale (PREPARE_VERSION 5);
- ``fp32``: a MatMul of K = 16 in fp32 (what the builder writes).

Each line also gives the mean relative error against float64 ``x @ weight``.

    python benchmarks/integer_product.py [--shapes 576x960 576x3072]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from nbresponses.models.fused import OPSET, _IntegerGraph
from nbresponses.runtime.runner import session_options

OUTLIERS = 16
ROWS = (1, 16, 370)


def _session(nodes, initializers, inputs) -> ort.InferenceSession:
    graph = helper.make_graph(
        nodes,
        "product",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    return ort.InferenceSession(
        model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
    )


def _row_forms(k: int, weight: np.ndarray) -> dict[str, ort.InferenceSession]:
    """name -> session on input "x" ("alone": on the quantized input "q" and its scales "s")."""
    q, scale = _IntegerGraph().quantize_weight(weight)
    consts = [
        numpy_helper.from_array(a, n)
        for a, n in [
            (q, "wq"),
            (scale, "ws"),
            (np.array([-1]), "axes"),
            (np.array(1 / 127, np.float32), "inv127"),
            (np.array(128, np.uint8), "zp"),
            (np.array(1, np.float32), "one"),
            (np.array([1], np.int64), "one_i64"),
        ]
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])
    peak = [
        helper.make_node("Abs", ["x"], ["abs"]),
        helper.make_node("ReduceMax", ["abs", "axes"], ["peak"], keepdims=1),
        helper.make_node("Mul", ["peak", "inv127"], ["s"]),
    ]
    product = helper.make_node(
        "MatMulIntegerToFloat", ["q", "wq", "s", "ws", "zp"], ["y"], domain="com.microsoft"
    )
    divide = [
        helper.make_node("Div", ["x", "s"], ["steps"]),
        helper.make_node("QuantizeLinear", ["steps", "one", "zp"], ["q"]),
    ]
    # the zero points of the rows: in the graph made once per run, here in front of the product
    blocked = [
        helper.make_node("Shape", ["x"], ["rows"], end=-1),
        helper.make_node("Concat", ["rows", "one_i64"], ["scale_shape"], axis=0),
        helper.make_node("Expand", ["zp", "scale_shape"], ["zps"]),
        helper.make_node("QuantizeLinear", ["x", "s", "zps"], ["q"], axis=-1, block_size=k),
    ]
    quantized = [
        helper.make_tensor_value_info("q", TensorProto.UINT8, ["b", "s", k]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, ["b", "s", 1]),
    ]
    return {
        "divide": _session(peak + divide + [product], consts, [x]),
        "blocked": _session(peak + blocked + [product], consts, [x]),
        "alone": _session([product], consts, quantized),
    }


def _outlier_forms(
    k: int, weight: np.ndarray, apart: np.ndarray
) -> dict[str, ort.InferenceSession]:
    """The outlier channels' product on its own (input: those channels, [b, s, 16])."""
    graph = _IntegerGraph()
    graph._integer_product("x", weight[apart], name="outliers", output="y")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", len(apart)])
    fp32 = helper.make_node("MatMul", ["x", "w"], ["y"])
    return {
        "integer": _session(graph.nodes, graph.initializers, [x]),
        "fp32": _session([fp32], [numpy_helper.from_array(weight[apart], "w")], [x]),
    }


def _time(session: ort.InferenceSession, feeds: dict[str, np.ndarray], rows: int) -> float:
    """Median microseconds of a run (fewer repeats for the larger runs)."""
    for _ in range(5):
        session.run(None, feeds)
    times = []
    for _ in range(300 if rows < 100 else 30):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _quantized(x: np.ndarray) -> dict[str, np.ndarray]:
    s = (np.abs(x).max(axis=-1, keepdims=True) * np.float32(1 / 127)).astype(np.float32)
    return {"q": (np.rint(x / s) + 128).astype(np.uint8), "s": s}


def measure(k: int, n: int) -> None:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((1, max(ROWS), k)).astype(np.float32)
    apart = np.sort(rng.choice(k, OUTLIERS, replace=False))
    x[..., apart] *= 30  # the norms' large channels
    exact = x[0].astype(np.float64) @ weight.astype(np.float64)
    rows = _row_forms(k, weight)
    outliers = _outlier_forms(k, weight, apart)
    picked = np.ascontiguousarray(x[..., apart])
    exact_outliers = picked[0].astype(np.float64) @ weight[apart].astype(np.float64)

    def feeds(data: np.ndarray, count: int, quantized: bool) -> dict[str, np.ndarray]:
        # decode-like (count rows of one position) below 370, a prefill run at 370
        part = data[:, :count] if count == max(ROWS) else data[0, :count][:, None]
        return _quantized(part) if quantized else {"x": part}

    for label, sessions, data, reference in (
        ("rows", rows, x, exact),
        ("outliers", outliers, picked, exact_outliers),
    ):
        whole = {
            name: s.run(None, feeds(data, max(ROWS), name == "alone"))[0].reshape(-1, n)
            for name, s in sessions.items()
        }
        for name, session in sessions.items():
            quantized = name == "alone"
            same = all(
                np.array_equal(
                    session.run(None, feeds(data, count, quantized))[0].reshape(-1, n),
                    whole[name][:count],
                )
                for count in ROWS[:-1]
            )
            error = float(np.abs(whole[name] - reference).mean() / np.abs(reference).mean())
            times = ", ".join(
                f"{count} rows {_time(session, feeds(data, count, quantized), count):8.1f} us"
                for count in ROWS
            )
            print(
                f"K {k} N {n} {label:8s} {name:8s}: {times}; "
                f"rows alone == together {same}; relative error {error:.5f}",
                flush=True,
            )
    divided = rows["divide"].run(None, {"x": x})[0]
    blocked = rows["blocked"].run(None, {"x": x})[0]
    same = np.array_equal(divided, blocked)
    print(f"K {k} N {n}: blocked == divide, bit for bit, {max(ROWS)} rows: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["576x960", "576x3072", "576x49152"])
    args = parser.parse_args()
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        measure(k, n)


if __name__ == "__main__":
    main()
