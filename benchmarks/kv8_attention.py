"""Would an 8-bit KV pay at 16 rows? One layer's two attention products of a 16-row decode
step, single operators: what the fused graph does (fp32 KV: ``FusedMatMul`` q·kᵀ, ``MatMul``
p·v) against an int8 KV (``MatMulInteger``: uint8 queries against int8 keys stored transposed,
one scale per key token and head applied after; p·v with each value token's scale folded into
p, p quantized per row), int32 sums converted and scaled. Integer sums are exact, so a row's
result would not depend on its batch-mates; what it costs is the error (printed against float64).

Not in the graph: the measurement behind issue #40's note that at 16 rows the fp32 KV reads
outweigh the weight products (benchmarks/README.md).

    python benchmarks/kv8_attention.py [--shapes 3x3x64 8x2x128] [--rows 16] [--keys 288]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from nbresponses.models.fused import OPSET
from nbresponses.runtime.runner import session_options

F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8


def _session(nodes, inputs) -> ort.InferenceSession:
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array(128, np.uint8), "zp")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    return ort.InferenceSession(
        model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
    )


def _integer_nodes(a: str, b: str, scales: list[str]) -> list:
    """a (uint8, zero point 128) times b (int8), exactly in int32, then times each scale."""
    nodes = [
        helper.make_node("MatMulInteger", [a, b, "zp"], ["sums"]),
        helper.make_node("Cast", ["sums"], ["scaled0"], to=F),
    ]
    for i, scale in enumerate(scales):
        out = "y" if i + 1 == len(scales) else f"scaled{i + 1}"
        nodes.append(helper.make_node("Mul", [f"scaled{i}", scale], [out]))
    return nodes


def _per_row(x: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(integers, scales): symmetric over the last axis, 127 steps, shifted by ``offset``."""
    scale = (np.abs(x).max(axis=-1, keepdims=True) / 127).astype(np.float32)
    q = np.rint(x / scale) + offset
    return q.astype(np.uint8 if offset else np.int8), scale


def _time(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> float:
    for _ in range(10):
        session.run(None, feeds)
    times = []
    for _ in range(300):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(rows: int, kv: int, group: int, head_dim: int, keys: int) -> None:
    rng = np.random.default_rng(0)
    b, g, d, w = rows, group, head_dim, keys
    q = rng.standard_normal((b, kv, g, d)).astype(np.float32)
    k = rng.standard_normal((b, kv, w, d)).astype(np.float32)
    v = rng.standard_normal((b, kv, w, d)).astype(np.float32)
    scale = np.float32(d**-0.5)
    scores = q.astype(np.float64) @ k.transpose(0, 1, 3, 2).astype(np.float64) * scale
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)
    context = p.astype(np.float64) @ v.astype(np.float64)

    k8, k_scale = _per_row(k, 0)  # one scale per key token and head
    v8, v_scale = _per_row(v, 0)
    q8, q_scale = _per_row(q, 128)
    p8, p_scale = _per_row(p * v_scale.transpose(0, 1, 3, 2), 128)  # value scales folded in
    forms = {
        "q.k fp32": (
            _session(
                [
                    helper.make_node(
                        "FusedMatMul",
                        ["q", "k"],
                        ["y"],
                        domain="com.microsoft",
                        transB=1,
                        alpha=float(scale),
                    )
                ],
                [("q", F, [b, kv, g, d]), ("k", F, [b, kv, w, d])],
            ),
            {"q": q, "k": k},
            scores,
        ),
        "q.k int8": (
            _session(
                _integer_nodes("q8", "k8t", ["qs", "ks"]),
                [
                    ("q8", U8, [b, kv, g, d]),
                    ("k8t", I8, [b, kv, d, w]),
                    ("qs", F, [b, kv, g, 1]),
                    ("ks", F, [b, kv, 1, w]),
                ],
            ),
            {
                "q8": q8,
                "k8t": np.ascontiguousarray(k8.transpose(0, 1, 3, 2)),
                "qs": q_scale * scale,
                "ks": np.ascontiguousarray(k_scale.transpose(0, 1, 3, 2)),
            },
            scores,
        ),
        "p.v fp32": (
            _session(
                [helper.make_node("MatMul", ["p", "v"], ["y"])],
                [("p", F, [b, kv, g, w]), ("v", F, [b, kv, w, d])],
            ),
            {"p": p, "v": v},
            context,
        ),
        "p.v int8": (
            _session(
                _integer_nodes("p8", "v8", ["ps"]),
                [("p8", U8, [b, kv, g, w]), ("v8", I8, [b, kv, w, d]), ("ps", F, [b, kv, g, 1])],
            ),
            {"p8": p8, "v8": v8, "ps": p_scale},
            context,
        ),
    }
    for name, (session, feeds, reference) in forms.items():
        out = session.run(None, feeds)[0]
        error = float(np.abs(out - reference).mean() / np.abs(reference).mean())
        kv_mb = sum(a.nbytes for n, a in feeds.items() if n in ("k", "v", "k8t", "v8")) / 1e6
        print(
            f"{rows} rows, {kv} KV heads x {group} queries x {head_dim}, {keys} keys, {name}: "
            f"{_time(session, feeds):7.1f} us a layer, {kv_mb:.2f} MB of KV, "
            f"mean relative error {error:.4f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["3x3x64", "8x2x128"],
        help="KV heads x queries per KV head x head dim (bundled model; Qwen3-0.6B)",
    )
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--keys", type=int, default=288)
    args = parser.parse_args()
    for shape in args.shapes:
        kv, group, head_dim = (int(v) for v in shape.split("x"))
        measure(args.rows, kv, group, head_dim, args.keys)


if __name__ == "__main__":
    main()
