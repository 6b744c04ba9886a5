"""Single-operator experiments behind the engine's step shapes: which attention paths are exact,
which step shapes GroupQueryAttention accepts, and what a decode step's attention costs.

Why this exists: exact speculation (verify K drafted tokens in one run) and mixed steps (decoding
rows plus a prompt chunk in one run) both need a multi-token step whose numbers equal the
one-token decode step's. This script measures, on random inputs shaped like the bundled model's
attention (9 query heads, 3 KV heads, head size 64, 2 threads):

1. GroupQueryAttention: a one-token step against the same position computed by prefill (not
   equal: the one-query path sums in another order), a two-token step (equal), and a batch of 2
   with 2 new tokens and a past (refused by the CPU kernel).
2. GroupQueryAttention: cold prompts batched with right padding against each prompt alone
   (equal), i.e. arrivals could be prefilled together without changing a bit.
3. Attention written with standard operators (ScatterND writing the new key and value into the
   bound KV buffer in place, MatMul with the query group as rows, Softmax, MatMul): a row's output
   alone against the same row in batches of other rows and buffer widths (equal), so one attention
   path could serve every step shape.
4. Cost per layer of a decode step at 1 and 16 rows, both paths.

    python benchmarks/attention.py
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

HEADS, KV_HEADS, HEAD = 9, 3, 64
GROUP = HEADS // KV_HEADS
THREADS = 2
MAX_POSITIONS = 4096


def _session(graph) -> ort.InferenceSession:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def _tensor(name: str, shape: list) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def gqa_session() -> ort.InferenceSession:
    """One GroupQueryAttention node with rotary inside, as in the fused graph."""
    inverse = 1.0 / (10000 ** (np.arange(0, HEAD, 2) / HEAD))
    angles = np.arange(MAX_POSITIONS)[:, None] * inverse[None]
    node = helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin", "positions"],
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=HEADS,
        kv_num_heads=KV_HEADS,
        do_rotary=1,
        scale=HEAD**-0.5,
    )
    graph = helper.make_graph(
        [node],
        "gqa",
        [
            _tensor("qkv", ["B", "S", (HEADS + 2 * KV_HEADS) * HEAD]),
            _tensor("past_k", ["B", KV_HEADS, "P", HEAD]),
            _tensor("past_v", ["B", KV_HEADS, "P", HEAD]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
            helper.make_tensor_value_info("positions", TensorProto.INT64, ["B", "S"]),
        ],
        [
            _tensor("out", ["B", "S", HEADS * HEAD]),
            _tensor("present_k", ["B", KV_HEADS, "T", HEAD]),
            _tensor("present_v", ["B", KV_HEADS, "T", HEAD]),
        ],
        [
            numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
            numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
        ],
    )
    return _session(graph)


def ops_session() -> ort.InferenceSession:
    """Decode attention from standard operators; the KV buffers are written in place."""
    nodes = [
        helper.make_node("Reshape", ["k", "kv_shape"], ["k4"]),
        helper.make_node("Reshape", ["v", "kv_shape"], ["v4"]),
        helper.make_node("ScatterND", ["past_k", "columns", "k4"], ["present_k"]),
        helper.make_node("ScatterND", ["past_v", "columns", "v4"], ["present_v"]),
        helper.make_node("Reshape", ["q", "q_shape"], ["q4"]),
        helper.make_node(
            "FusedMatMul",
            ["q4", "present_k"],
            ["scores"],
            domain="com.microsoft",
            transB=1,
            alpha=HEAD**-0.5,
        ),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present_v"], ["o4"]),
        helper.make_node("Reshape", ["o4", "out_shape"], ["out"]),
    ]
    shapes = [
        helper.make_tensor("kv_shape", TensorProto.INT64, [4], [0, KV_HEADS, 1, HEAD]),
        helper.make_tensor("q_shape", TensorProto.INT64, [4], [0, KV_HEADS, GROUP, HEAD]),
        helper.make_tensor("out_shape", TensorProto.INT64, [2], [0, HEADS * HEAD]),
    ]
    graph = helper.make_graph(
        nodes,
        "ops",
        [
            _tensor("q", ["B", HEADS * HEAD]),
            _tensor("k", ["B", KV_HEADS * HEAD]),
            _tensor("v", ["B", KV_HEADS * HEAD]),
            _tensor("past_k", ["B", KV_HEADS, "C", HEAD]),
            _tensor("past_v", ["B", KV_HEADS, "C", HEAD]),
            helper.make_tensor_value_info("columns", TensorProto.INT64, ["B", KV_HEADS, 1, 3]),
            _tensor("bias", ["B", 1, 1, "C"]),
        ],
        [
            _tensor("out", ["B", HEADS * HEAD]),
            _tensor("present_k", ["B", KV_HEADS, "C", HEAD]),
            _tensor("present_v", ["B", KV_HEADS, "C", HEAD]),
        ],
        shapes,
    )
    return _session(graph)


def bind_in_place(session, feeds: dict, keys: np.ndarray, values: np.ndarray) -> Any:
    """An IO binding with the KV buffers bound as both past and present (the graph writes the
    new columns into them), the feeds, and ``out``."""
    binding = session.io_binding()
    binding.bind_output("out")
    k, v = ort.OrtValue.ortvalue_from_numpy(keys), ort.OrtValue.ortvalue_from_numpy(values)
    binding.bind_ortvalue_input("past_k", k)
    binding.bind_ortvalue_output("present_k", k)
    binding.bind_ortvalue_input("past_v", v)
    binding.bind_ortvalue_output("present_v", v)
    for name, value in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    return binding


def _run_in_place(session, feeds: dict, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Run with the KV buffers bound as both past and present; returns ``out``."""
    binding = bind_in_place(session, feeds, keys, values)
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


class GQA:
    def __init__(self) -> None:
        self.session = gqa_session()

    def step(self, qkv, keys, values, lengths: list[int]) -> np.ndarray:
        """Append ``qkv``'s S tokens to each row (rows hold ``lengths`` tokens at the start)."""
        s = qkv.shape[1]
        feeds = {
            "qkv": qkv,
            "seqlens_k": np.array([n + s - 1 for n in lengths], np.int32),
            "total": np.array(max(lengths) + s, np.int32),
            "positions": np.array([[n + j for j in range(s)] for n in lengths], np.int64),
        }
        return _run_in_place(self.session, feeds, keys, values)

    def prompts(self, xs: list[np.ndarray], capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """Cold prompts in one run, right-padded, each row's length in ``seqlens_k``."""
        s = max(x.shape[1] for x in xs)
        qkv = np.zeros((len(xs), s, xs[0].shape[2]), np.float32)
        for i, x in enumerate(xs):
            qkv[i, : x.shape[1]] = x[0]
        keys = np.zeros((len(xs), KV_HEADS, capacity, HEAD), np.float32)
        values = np.zeros_like(keys)
        feeds = {
            "qkv": qkv,
            "seqlens_k": np.array([x.shape[1] - 1 for x in xs], np.int32),
            "total": np.array(s, np.int32),
            "positions": np.tile(np.arange(s, dtype=np.int64), (len(xs), 1)),
        }
        return _run_in_place(self.session, feeds, keys, values), keys

    def prefill(self, x, capacity: int, past=None, past_length: int = 0):
        keys = np.zeros((1, KV_HEADS, capacity, HEAD), np.float32)
        values = np.zeros_like(keys)
        if past is not None:
            keys[:, :, :past_length] = past[0][:, :, :past_length]
            values[:, :, :past_length] = past[1][:, :, :past_length]
        return self.step(x, keys, values, [past_length]), (keys, values)


def _qkv(n: int, seed: int) -> np.ndarray:
    width = (HEADS + 2 * KV_HEADS) * HEAD
    return np.random.default_rng(seed).standard_normal((1, n, width)).astype(np.float32)


def gqa_step_shapes(gqa: GQA) -> None:
    x = _qkv(800, 1)
    full, _ = gqa.prefill(x, 1024)
    one, two = [], []
    for past in (1, 5, 37, 100, 300, 700):
        _, kv = gqa.prefill(x[:, :past], 1024)
        d1, _ = gqa.prefill(x[:, past : past + 1], 1024, kv, past)
        d2, _ = gqa.prefill(x[:, past : past + 2], 1024, kv, past)
        one.append(float(np.abs(d1[0, 0] - full[0, past]).max()))
        two.append(bool(np.array_equal(d2[0, 0], full[0, past])))
    print(f"1. GQA one-token step vs prefill at the same position, max |diff|: {max(one):.2e}")
    print(f"   GQA two-token step vs prefill: equal at every position tried: {all(two)}")
    try:
        keys = np.zeros((2, KV_HEADS, 64, HEAD), np.float32)
        gqa.step(np.concatenate([_qkv(2, 1), _qkv(2, 2)]), keys, keys.copy(), [5, 7])
        print("   GQA batch 2 x 2 new tokens with a past: accepted")
    except Exception as exc:  # the CPU kernel's shape check
        print(f"   GQA batch 2 x 2 new tokens with a past: refused ({str(exc).split(': ')[-1]})")


def gqa_batched_prompts(gqa: GQA) -> None:
    bad = 0
    for lengths in ([43, 60, 17, 183, 100, 44], [129, 184], [257, 300, 18], [2, 256, 512]):
        # each alone as the engine runs it: an even count, a dummy after an odd one
        xs = [_qkv(n + n % 2, 20 + i) for i, n in enumerate(lengths)]
        out, keys = gqa.prompts([x[:, :n] for x, n in zip(xs, lengths, strict=True)], 1024)
        for i, (x, n) in enumerate(zip(xs, lengths, strict=True)):
            alone, (k1, _) = gqa.prefill(x, 1024)
            same = np.array_equal(out[i, :n], alone[0, :n])
            bad += not (same and np.array_equal(keys[i, :, :n], k1[0, :, :n]))
    print(f"2. GQA cold prompts batched with right padding vs alone: {bad} rows differ")


class OpsAttention:
    def __init__(self) -> None:
        self.session = ops_session()

    def step(self, q, k, v, keys, values, lengths: list[int]) -> np.ndarray:
        b, capacity = keys.shape[0], keys.shape[2]
        columns = np.zeros((b, KV_HEADS, 1, 3), np.int64)
        bias = np.full((b, 1, 1, capacity), -np.inf, np.float32)
        for row, n in enumerate(lengths):
            columns[row, :, 0] = [(row, h, n) for h in range(KV_HEADS)]
            bias[row, 0, 0, : n + 1] = 0.0
        feeds = {"q": q, "k": k, "v": v, "columns": columns, "bias": bias}
        return _run_in_place(self.session, feeds, keys, values)


def _ops_batch(ops: OpsAttention, rows: int, capacity: int) -> np.ndarray:
    """Row 0 is always the same request (37 tokens of past); the others are random."""
    own, others = np.random.default_rng(99), np.random.default_rng(rows * 1000 + capacity)
    keys = np.zeros((rows, KV_HEADS, capacity, HEAD), np.float32)
    values = np.zeros_like(keys)
    lengths = [37] + [int(n) for n in others.integers(1, capacity - 1, rows - 1)]
    for row, n in enumerate(lengths):
        source = own if row == 0 else others
        keys[row, :, :n] = source.random((KV_HEADS, n, HEAD), dtype=np.float32)
        values[row, :, :n] = source.random((KV_HEADS, n, HEAD), dtype=np.float32)
    q = others.random((rows, HEADS * HEAD), dtype=np.float32)
    k = others.random((rows, KV_HEADS * HEAD), dtype=np.float32)
    v = others.random((rows, KV_HEADS * HEAD), dtype=np.float32)
    q[0] = own.random(HEADS * HEAD, dtype=np.float32)
    k[0] = own.random(KV_HEADS * HEAD, dtype=np.float32)
    v[0] = own.random(KV_HEADS * HEAD, dtype=np.float32)
    return ops.step(q, k, v, keys, values, lengths)[0]


def ops_exactness(ops: OpsAttention) -> None:
    alone = _ops_batch(ops, 1, 64)
    shapes = [(1, 40), (1, 100), (1, 128), (2, 64), (7, 1024), (16, 384), (16, 448)]
    differ = [s for s in shapes if not np.array_equal(_ops_batch(ops, *s), alone)]
    print(f"3. standard-op attention, one row alone vs batches/widths {shapes}: differ {differ}")


def _per_layer_us(run, repeats: int = 200) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.percentile(times, 20)) * 1e6


def costs(gqa: GQA, ops: OpsAttention) -> None:
    rng = np.random.default_rng(3)
    print("4. one decode step's attention, microseconds per layer (20th percentile):")
    for rows, length in ((1, 150), (16, 150), (16, 300)):
        capacity = length + 128
        keys = rng.random((rows, KV_HEADS, capacity, HEAD), dtype=np.float32)
        values = rng.random((rows, KV_HEADS, capacity, HEAD), dtype=np.float32)
        qkv = _qkv(rows, 4).reshape(rows, 1, -1)
        lengths = [length] * rows
        g = _per_layer_us(partial(gqa.step, qkv, keys, values, lengths))
        q, k, v = (rng.random((rows, n * HEAD), dtype=np.float32) for n in (HEADS, KV_HEADS, 3))
        o = _per_layer_us(partial(ops.step, q, k, v, keys, values, lengths))
        print(f"   {rows:2} rows x {length} keys: GQA {g:6.0f}   standard ops {o:6.0f}")


def main() -> None:
    print(f"onnxruntime {ort.__version__}, {THREADS} threads")
    gqa, ops = GQA(), OpsAttention()
    gqa_step_shapes(gqa)
    gqa_batched_prompts(gqa)
    ops_exactness(ops)
    costs(gqa, ops)


if __name__ == "__main__":
    main()
