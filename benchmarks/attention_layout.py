"""Single-operator experiments for prefill attention: which layouts of the same attention compute
the same bits, and what each costs per layer (issue #40, hypothesis 1).

One attention layer shaped like the bundled model's (9 query heads, 3 KV heads, head size 64,
2 threads), the new keys and values written into the bound buffers in place, as the fused graph
does. Layouts:

- ``position``: the queries as [B, S, kv, group, hd] against keys [B, 1, kv, W, hd]: one small
  product of ``group`` rows per (row, position, KV head), each packing the keys again (the
  layout of the graphs before this experiment);
- ``head``: the queries transposed to [B, kv, S * group, hd]: one product per (row, KV head)
  with every position's queries as its rows, the mask expanded to [B, 1, S * group, W];
- ``head+used``: ``head`` over the columns up to the step's last position only (a Slice of the
  buffers: a copy);
- ``head+blocks``: ``head`` with the step's queries in two blocks, each against the keys up to
  its own last position (skips about a quarter of a cold prompt's masked triangle).

Each layout is checked against ``position`` bit for bit on random inputs at every shape (a
token's output must not depend on the layout, the batch or the buffer width), then timed,
round-robin, 20th percentiles.

    python benchmarks/attention_layout.py --repeats 30
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
from attention import bind_in_place
from onnx import TensorProto, helper, numpy_helper

HEADS, KV, HD = 9, 3, 64
GROUP = HEADS // KV
THREADS = 2


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        self._n += 1
        name = f"c{self._n}"
        self.inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def __call__(self, op: str, inputs: list[str], outputs: int | list[str] = 1, **attrs) -> Any:
        self._n += 1
        if isinstance(outputs, int):
            outputs = [f"{op}{self._n}_{i}" for i in range(outputs)]
        domain = "com.microsoft" if op == "FusedMatMul" else ""
        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs


def _common(g: _Builder) -> tuple[str, str, str]:
    """Write k, v into the buffers at ``position_ids``; returns (keys, values, visible [B,S,W])."""
    ids_shape = g("Shape", ["position_ids"])
    index_shape = g("Concat", [ids_shape, g.const([KV, 1])], axis=0)
    batch = g("Gather", [ids_shape, g.const(0)])
    rows = g("Range", [g.const(0), batch, g.const(1)])
    parts = [
        g("Expand", [g("Reshape", [rows, g.const([-1, 1, 1, 1])]), index_shape]),
        g("Expand", [g.const(np.arange(KV).reshape(1, 1, -1, 1)), index_shape]),
        g("Expand", [g("Unsqueeze", ["position_ids", g.const([2, 3])]), index_shape]),
    ]
    index = g("Concat", parts, axis=-1)
    split = {t: g("Reshape", [t, g.const([0, 0, KV, HD])]) for t in ("k", "v")}
    keys = g("ScatterND", ["past_k", index, split["k"]], ["present_k"])
    values = g("ScatterND", ["past_v", index, split["v"]], ["present_v"])
    width = g("Gather", [g("Shape", [keys]), g.const([2])])
    columns = g("Range", [g.const(0), g("Squeeze", [width]), g.const(1)])
    visible = g("LessOrEqual", [columns, g("Unsqueeze", ["position_ids", g.const([2])])])
    return keys, values, visible


def _bias(g: _Builder, visible: str) -> str:
    return g("Where", [visible, g.const(0.0, np.float32), g.const(-np.inf, np.float32)])


def position_layout(g: _Builder) -> None:
    keys, values, visible = _common(g)
    bias = g("Unsqueeze", [_bias(g, visible), g.const([2, 3])])  # [B, S, 1, 1, W]
    k, v = (g("Unsqueeze", [t, g.const([1])]) for t in (keys, values))
    q = g("Reshape", ["q", g.const([0, 0, KV, GROUP, HD])])
    scores = g("FusedMatMul", [q, k], transB=1, alpha=HD**-0.5)
    probs = g("Softmax", [g("Add", [scores, bias])], axis=-1)
    context = g("MatMul", [probs, v])
    g("Reshape", [context, g.const([0, 0, HEADS * HD])], ["out"])


def _head_bias(g: _Builder, visible: str) -> str:
    """[B, S, W] -> [B, 1, S * group, W]: each position's row repeated for its query group."""
    bias = g("Unsqueeze", [_bias(g, visible), g.const([2])])  # [B, S, 1, W]
    shape = g("Shape", [bias])
    b, s, w = (g("Gather", [shape, g.const([i])]) for i in (0, 1, 3))
    grouped = g("Expand", [bias, g("Concat", [b, s, g.const([GROUP]), w], axis=0)])
    return g("Reshape", [grouped, g.const([0, 1, -1, 0])])  # [B, 1, S*g, W]


def _head_queries(g: _Builder) -> str:
    q = g("Reshape", ["q", g.const([0, 0, KV, GROUP * HD])])
    q = g("Transpose", [q], perm=[0, 2, 1, 3])  # [B, kv, S, g*hd]
    return g("Reshape", [q, g.const([0, 0, -1, HD])])  # [B, kv, S*g, hd]


def _head_attend(g: _Builder, q: str, keys: str, values: str, bias: str) -> str:
    scores = g("FusedMatMul", [q, keys], transB=1, alpha=HD**-0.5)  # [B, kv, S*g, W]
    probs = g("Softmax", [g("Add", [scores, bias])], axis=-1)
    return g("MatMul", [probs, values])  # [B, kv, S*g, hd]


def _head_out(g: _Builder, context: str) -> None:
    context = g("Reshape", [context, g.const([0, 0, -1, GROUP * HD])])  # [B, kv, S, g*hd]
    context = g("Transpose", [context], perm=[0, 2, 1, 3])  # [B, S, kv, g*hd]
    g("Reshape", [context, g.const([0, 0, HEADS * HD])], ["out"])


def head_layout(g: _Builder) -> None:
    keys, values, visible = _common(g)
    _head_out(g, _head_attend(g, _head_queries(g), keys, values, _head_bias(g, visible)))


def _used(g: _Builder, positions: str) -> str:
    """[1]: the columns a step's tokens see at most (its last position + 1)."""
    top = g("ReduceMax", [positions], keepdims=0)
    return g("Reshape", [g("Add", [top, g.const(1)]), g.const([1])])


def _columns(g: _Builder, x: str, end: str, axis: int) -> str:
    return g("Slice", [x, g.const([0]), end, g.const([axis])])


def head_used_layout(g: _Builder) -> None:
    keys, values, visible = _common(g)
    end = _used(g, "position_ids")
    keys, values = _columns(g, keys, end, 2), _columns(g, values, end, 2)
    bias = _columns(g, _head_bias(g, visible), end, 3)
    _head_out(g, _head_attend(g, _head_queries(g), keys, values, bias))


def head_blocks_layout(g: _Builder) -> None:
    """Two blocks of positions (the first half rounded up), each over the keys it can see."""
    keys, values, visible = _common(g)
    q = _head_queries(g)  # [B, kv, S*g, hd]
    bias = _head_bias(g, visible)  # [B, 1, S*g, W]
    s = g("Gather", [g("Shape", ["position_ids"]), g.const([1])])
    half = g("Div", [g("Add", [s, g.const([1])]), g.const([2])])
    bounds = [(g.const([0]), half), (half, s)]
    outs = []
    for begin, stop in bounds:
        positions = g("Slice", ["position_ids", begin, stop, g.const([1])])
        end = _used(g, positions)
        rows = (g("Mul", [begin, g.const([GROUP])]), g("Mul", [stop, g.const([GROUP])]))
        qb = g("Slice", [q, *rows, g.const([2])])
        bb = g("Slice", [bias, rows[0], rows[1], g.const([2])])
        bb = _columns(g, bb, end, 3)
        kb, vb = _columns(g, keys, end, 2), _columns(g, values, end, 2)
        outs.append(_head_attend(g, qb, kb, vb, bb))
    _head_out(g, g("Concat", outs, axis=2))


LAYOUTS: dict[str, Callable[[_Builder], None]] = {
    "position": position_layout,
    "head": head_layout,
    "head+used": head_used_layout,
    "head+blocks": head_blocks_layout,
}


def session(layout: Callable[[_Builder], None], profile: str | None = None) -> ort.InferenceSession:
    g = _Builder()
    layout(g)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        g.nodes,
        "attention",
        [
            helper.make_tensor_value_info("q", f, ["B", "S", HEADS * HD]),
            helper.make_tensor_value_info("k", f, ["B", "S", KV * HD]),
            helper.make_tensor_value_info("v", f, ["B", "S", KV * HD]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "S"]),
            helper.make_tensor_value_info("past_k", f, ["B", KV, "W", HD]),
            helper.make_tensor_value_info("past_v", f, ["B", KV, "W", HD]),
        ],
        [
            helper.make_tensor_value_info("out", f, ["B", "S", HEADS * HD]),
            helper.make_tensor_value_info("present_k", f, ["B", KV, "W", HD]),
            helper.make_tensor_value_info("present_v", f, ["B", KV, "W", HD]),
        ],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


class Case:
    """One step: ``batch`` rows, ``lengths`` tokens of past each, ``new`` tokens each,
    buffers of ``capacity`` columns."""

    def __init__(self, lengths: list[int], new: int, capacity: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        b = len(lengths)
        self.keys = np.zeros((b, KV, capacity, HD), np.float32)
        self.values = np.zeros_like(self.keys)
        for row, n in enumerate(lengths):
            self.keys[row, :, :n] = rng.standard_normal((KV, n, HD), dtype=np.float32)
            self.values[row, :, :n] = rng.standard_normal((KV, n, HD), dtype=np.float32)
        self.feeds = {
            "q": rng.standard_normal((b, new, HEADS * HD), dtype=np.float32),
            "k": rng.standard_normal((b, new, KV * HD), dtype=np.float32),
            "v": rng.standard_normal((b, new, KV * HD), dtype=np.float32),
            "position_ids": np.array([[n + j for j in range(new)] for n in lengths], np.int64),
        }

    def run(self, s: ort.InferenceSession) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(out, keys, values) of one run on copies of the buffers."""
        keys, values = self.keys.copy(), self.values.copy()
        binding = bind_in_place(s, self.feeds, keys, values)
        s.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0], keys, values

    def timer(self, s: ort.InferenceSession) -> Callable[[], float]:
        """Seconds of one run, the buffers bound once (rewritten in place at the same columns)."""
        binding = bind_in_place(s, self.feeds, self.keys, self.values)

        def run() -> float:
            start = time.perf_counter()
            s.run_with_iobinding(binding)
            return time.perf_counter() - start

        return run


def exactness(sessions: dict[str, ort.InferenceSession]) -> None:
    """Every layout against ``position``, and a row alone against the same row among others
    and in wider buffers, prefill positions against one-token steps."""
    cases = [
        ([0], 256, 256),
        ([256], 114, 370),
        ([0], 370, 370),
        ([0], 2, 40),
        ([37], 1, 40),
        ([37, 5, 300, 0], 3, 333),
        ([150] * 16, 1, 182),
        ([300] * 16, 4, 336),
    ]
    differ = []
    for i, (lengths, new, capacity) in enumerate(cases):
        case = Case(lengths, new, capacity, seed=i)
        reference = case.run(sessions["position"])
        for name, s in sessions.items():
            if not all(map(np.array_equal, case.run(s), reference)):
                differ.append((name, lengths[:2], new, capacity))
    print(f"layouts against `position`, {len(cases)} shapes: differ {differ or 'nowhere'}")
    # a token's bits independent of the step shape: a prefill of 64 against steps of 1 to 30
    # tokens in buffers of other widths
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 64, n * HD), dtype=np.float32) for n in (HEADS, KV, KV))
    for name, s in sessions.items():
        full = Case([0], 64, 96)
        full.feeds.update(q=q, k=k, v=v)
        whole = full.run(s)[0]
        keys = values = np.zeros((1, KV, 0, HD), np.float32)
        parts, at = [], 0
        for count in (1, 2, 3, 1, 5, 8, 1, 13, 30):
            step = Case([at], count, at + count + (37 if at % 2 else 0))
            step.keys[:, :, :at], step.values[:, :, :at] = keys, values
            window = slice(at, at + count)
            step.feeds.update(q=q[:, window], k=k[:, window], v=v[:, window])
            out, keys, values = step.run(s)
            parts.append(out)
            at += count
            keys, values = keys[:, :, :at], values[:, :, :at]
        same = np.array_equal(np.concatenate(parts, axis=1), whole)
        print(f"  {name}: prefill of 64 == steps of 1..30 tokens at other widths: {same}")


SHAPES = {
    "prefill 256 cold (S=256, W=256)": ([0], 256, 256),
    "2nd run of a 370 doc (S=114, W=370)": ([256], 114, 370),
    "prefill 370 in one run (S=370, W=370)": ([0], 370, 370),
    "prefill 128 at 256 (S=128, W=384)": ([256], 128, 384),
    "run of 64 at 128 (S=64, W=192)": ([128], 64, 192),
    "decode x1 (W=232, 200 used)": ([200], 1, 232),
    "decode x16 (W=332, 300 used)": ([300] * 16, 1, 332),
    "verify x16 S=4 (W=336)": ([300] * 16, 4, 336),
}


def timing(sessions: dict[str, ort.InferenceSession], repeats: int) -> None:
    # the 20th percentile: a run whose thread lost its core for a time slice to another process
    # costs several milliseconds more, whatever the layout
    print(f"\nmicroseconds per layer (20th percentile of {repeats}, round-robin)")
    print("| step | " + " | ".join(sessions) + " |")
    print("|---|" + "---|" * len(sessions))
    for label, (lengths, new, capacity) in SHAPES.items():
        case = Case(lengths, new, capacity)
        timers = {name: case.timer(s) for name, s in sessions.items()}
        for t in timers.values():
            t()
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(repeats):
            for name, t in timers.items():
                times[name].append(t())
        cells = [f"{np.percentile(v, 20) * 1e6:.0f}" for v in times.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}, {THREADS} threads")
    sessions = {name: session(LAYOUTS[name]) for name in ["position", *args.layouts]}
    exactness(sessions)
    timing(sessions, args.repeats)


if __name__ == "__main__":
    main()
