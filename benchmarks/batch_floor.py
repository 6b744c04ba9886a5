"""What a 16-request run's integer products alone cost: the floor under issue #40's x16 target.

``decode.py``'s x16 chat scenario prefills 16 prompts (36-226 tokens) and then decodes 128 tokens
in 16-row steps. This script takes every ``GroupProduct`` node of the prepared graph (default
``fused-int8-kernel``), with its own weights and attributes, and runs them alone on random
inputs of their widths, 2 threads: the LM head apart (a prefill computes it for one position,
a decode step for every row). It prints, per round, the products of a 16-row step and of a
one-row step, those of the 16 prompts' prefills, and their sum over a 128-token x16 run: the
time no graph with these products can go under, to set against the target (6x the engine's
own batch-1 decode, from ``decode.py`` in the same session).

The peer, in the same rounds: ONNX Runtime's own u8 x s8 ``MatMulInteger`` (MLAS) on the same
shapes, random int8 weights of the same sizes, its input already quantized. It does less than a
``GroupProduct`` (no activation quantization, no scales, no outlier channels: int32 out), so it
tells what ONNX Runtime's own integer GEMM, well tuned for this CPU, would leave of the budget.

    python benchmarks/batch_floor.py [--recipe fused-int8-kernel] [--rounds 3] [--tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from workloads import load_workloads

from nbresponses.models import kernels
from nbresponses.models.prepare import prepare_model

Session = tuple[ort.InferenceSession, dict[str, int]]  # a session and its inputs' widths


def product_sessions(path: str, peer: bool = False) -> tuple[Session, Session]:
    """Two sessions of the graph's GroupProduct nodes alone: the body's, and the LM head's;
    with ``peer``, each node's shape as a ``MatMulInteger`` instead."""
    model = onnx.load(path)
    weights = {i.name: i for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "GroupProduct"]
    if not nodes:
        raise SystemExit(f"{path} has no GroupProduct nodes (a fused-int8-kernel graph has)")

    def width(node: onnx.NodeProto) -> int:
        return weights[node.input[2]].dims[1] * 4  # weight [N16 / 16, K / 4, 64]

    def columns(node: onnx.NodeProto) -> int:
        return weights[node.input[2]].dims[0] * 16

    vocabulary = max(columns(n) for n in nodes)

    rng = np.random.default_rng(0)

    def integer(i: int, n: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.TensorProto]:
        weight = rng.integers(-127, 128, (width(n), columns(n)), dtype=np.int8)
        node = helper.make_node("MatMulInteger", [f"x{width(n)}", f"b{i}"], [f"out{i}"])
        return node, numpy_helper.from_array(weight, f"b{i}")

    def session(keep: Callable[[onnx.NodeProto], bool]) -> Session:
        chosen = [n for n in nodes if keep(n)]
        widths = {f"x{width(n)}": width(n) for n in chosen}
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        value = helper.make_tensor_value_info
        if peer:
            pairs = [integer(i, n) for i, n in enumerate(chosen)]
            graph = helper.make_graph(
                [node for node, _ in pairs],
                "peer",
                [value(k, TensorProto.UINT8, ["M", w]) for k, w in widths.items()],
                [value(node.output[0], TensorProto.INT32, None) for node, _ in pairs],
                [weight for _, weight in pairs],
            )
            built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            return ort.InferenceSession(built.SerializeToString(), options), widths
        copies = [
            helper.make_node(
                "GroupProduct",
                [f"x{width(n)}", *n.input[1:]],
                [f"out{i}_{j}" for j in range(len(n.output))],
                domain=n.domain,
                **{a.name: helper.get_attribute_value(a) for a in n.attribute},
            )
            for i, n in enumerate(chosen)
        ]
        graph = helper.make_graph(
            copies,
            "products",
            [value(k, TensorProto.FLOAT, ["M", w]) for k, w in widths.items()],
            [value(o, TensorProto.FLOAT, None) for c in copies for o in c.output],
            [weights[name] for n in chosen for name in n.input[1:] if name in weights],
        )
        kernels.register(options)
        built = helper.make_model(graph, opset_imports=model.opset_import)
        return ort.InferenceSession(built.SerializeToString(), options), widths

    return session(lambda n: columns(n) < vocabulary), session(lambda n: columns(n) == vocabulary)


def median_ms(session: Session, rows: int, repeats: int, rng: np.random.Generator) -> float:
    runner, widths = session
    if runner.get_inputs()[0].type == "tensor(uint8)":  # the peer's: already quantized
        feed = {k: rng.integers(0, 256, (rows, w), dtype=np.uint8) for k, w in widths.items()}
    else:
        feed = {k: rng.standard_normal((rows, w), dtype=np.float32) for k, w in widths.items()}
    runner.run(None, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="fused-int8-kernel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="tokens a request generates")
    args = parser.parse_args()
    prepared = prepare_model(None, args.recipe, progress=False)
    path = str(prepared.path / "model.onnx")
    body, head = product_sessions(path)
    prompts = load_workloads(prepared.load_tokenizer(), ["chat"])[0].take(16)
    print(f"{prepared.describe()}\n16 chat prompts, {sum(map(len, prompts))} tokens; 2 threads")
    kinds = {"GroupProduct": (body, head), "MLAS MatMulInteger": product_sessions(path, peer=True)}
    rng = np.random.default_rng(0)
    for number in range(1, args.rounds + 1):
        for kind, (layers, lm_head) in kinds.items():
            step16 = median_ms(layers, 16, 30, rng) + median_ms(lm_head, 16, 30, rng)
            step1 = median_ms(layers, 1, 30, rng) + median_ms(lm_head, 1, 30, rng)
            prefill = sum(median_ms(layers, len(p), 3, rng) for p in prompts)
            prefill += 16 * median_ms(lm_head, 1, 30, rng)
            run = prefill + (args.tokens - 1) * step16  # the first token comes from the prefill
            print(
                f"round {number}, {kind}: products of a 16-row step {step16:.2f} ms, "
                f"of a one-row step {step1:.2f} ms; of the 16 prefills {prefill:.0f} ms; "
                f"of a {args.tokens}-token x16 run {run / 1000:.2f} s "
                f"({16 * args.tokens / run * 1000:.0f} tok/s at most)"
            )


if __name__ == "__main__":
    main()
