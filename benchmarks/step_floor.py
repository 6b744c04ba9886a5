"""Where a batch-1 decode step's time goes: the 8-bit weights' read, and the kernels around it.

The hypothesis behind the batch-1 figures: a decode step of the bundled model is bound by
reading its weights once (every MatMulNBits of the graph, ~150 MB at 8 bits with block
scales), and most of the rest is ONNX Runtime dispatching ~600 small kernels one by one. This
script measures the three in isolation, on the prepared ``fused-q8`` graph, 2 threads:

1. the engine's decode step at batch 1 (in-place KV, ``--keys`` columns);
2. the same graph's MatMulNBits nodes alone, with its own weights, one token each: the floor
   any graph with these weights pays;
3. a chain of as many tiny kernels as the step runs besides them (an Add of one 576-float
   row): the dispatch cost of the step's kernel count.

    python benchmarks/step_floor.py [--keys 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from nbresponses.models.prepare import prepare_model
from nbresponses.models.recipes import AUTO_ORDER
from nbresponses.runtime.kv import EndPaddedKV
from nbresponses.runtime.runner import OnnxRunner, session_options


def median_ms(runs: list, reps: int) -> list[float]:
    """Median time of each of ``runs``, taking turns so that a noisy moment hits all alike."""
    times: list[list[float]] = [[] for _ in runs]
    for run in runs:
        run()
    for _ in range(reps):
        for run, out in zip(runs, times, strict=True):
            start = time.perf_counter()
            run()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) * 1000 for t in times]


def matmuls_only(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int]:
    """A graph of the model's MatMulNBits nodes, each fed its own one-token input."""
    weights = {i.name: i for i in model.graph.initializer}
    nodes, inputs, outputs = [], [], []
    used: set[str] = set()
    feeds: dict[str, np.ndarray] = {}
    for j, node in enumerate(n for n in model.graph.node if n.op_type == "MatMulNBits"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x, y = f"x{j}", f"y{j}"
        inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, attrs["K"]]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, attrs["N"]]))
        feeds[x] = np.random.default_rng(j).standard_normal((1, attrs["K"])).astype(np.float32)
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[0]
        copy.input.insert(0, x)
        del copy.output[:]
        copy.output.append(y)
        nodes.append(copy)
        used.update(n for n in node.input[1:] if n)
    graph = helper.make_graph(nodes, "matmuls", inputs, outputs, [weights[n] for n in used])
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out, feeds, len(nodes)


def kernel_chain(count: int, width: int = 576) -> onnx.ModelProto:
    one = helper.make_tensor("one", TensorProto.FLOAT, [1, width], np.ones(width, np.float32))
    nodes = [
        helper.make_node("Add", [f"t{i}", "one"], [f"t{i + 1}"], name=f"add{i}")
        for i in range(count)
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"t{count}", TensorProto.FLOAT, [1, width])],
        [one],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=AUTO_ORDER[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    prepared = prepare_model(None, args.recipe, progress=False)
    runner = OnnxRunner(prepared.onnx_path)
    layout = runner.layout
    kv = EndPaddedKV(layout, reads_every_column=runner.reads_every_column)
    kv.add_rows([layout.zeros(args.keys)])

    def step() -> None:
        kv.step(runner, [5])
        kv.truncate(0, args.keys)

    model = onnx.load(str(prepared.onnx_path))
    only, feeds, matmuls = matmuls_only(model)
    session = ort.InferenceSession(only.SerializeToString(), session_options())
    weight_bytes = sum(i.ByteSize() for i in only.graph.initializer)

    options = session_options()
    options.optimized_model_filepath = str(prepared.path / "optimized-for-count.onnx")
    ort.InferenceSession(str(prepared.onnx_path), options)
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    (prepared.path / "optimized-for-count.onnx").unlink()
    kernels = len(optimized.graph.node)
    others = kernels - matmuls
    chain = ort.InferenceSession(kernel_chain(others).SerializeToString(), session_options())
    start = {"t0": np.zeros((1, 576), np.float32)}
    step_ms, floor_ms, chain_ms = median_ms(
        [step, lambda: session.run(None, feeds), lambda: chain.run(None, start)], args.reps
    )

    print(f"{prepared.name} [{args.recipe}], batch 1, {args.keys} keys, medians of {args.reps}\n")
    print("| part | kernels | ms | share of the step |\n|---|---|---|---|")
    print(f"| decode step (engine) | {kernels} | {step_ms:.2f} | 100% |")
    print(
        f"| its MatMulNBits alone ({weight_bytes / 1e6:.0f} MB of weights: "
        f"{weight_bytes / floor_ms / 1e6:.1f} GB/s) | {matmuls} | {floor_ms:.2f} | "
        f"{100 * floor_ms / step_ms:.0f}% |"
    )
    print(
        f"| a chain of {others} one-row Adds (dispatch) | {others} | {chain_ms:.2f} | "
        f"{100 * chain_ms / step_ms:.0f}% |"
    )
    rest = step_ms - floor_ms - chain_ms
    print(
        f"| the rest (attention, norms, rotary, logits) | | {rest:.2f} | "
        f"{100 * rest / step_ms:.0f}% |"
    )


if __name__ == "__main__":
    main()
