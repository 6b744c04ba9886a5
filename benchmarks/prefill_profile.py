"""Where a prefill's milliseconds go: ONNX Runtime's profile of the engine's scoring runs of one
document, summed by kind of node.

The document (``--tokens`` of the fidelity set's text) is computed as a scoring job computes it
(runs of ``SCORE_CHUNK`` tokens, every position's logits, the KV of each run copied into the next
run's buffers), ``--rounds`` times after a warm-up; each node's kernel time is summed per round
and the medians printed, by kind:

- products: the weight matrices' multiplies (MatMulNBits, MatMulIntegerToFloat, fp32 MatMul of
  the projections and the LM head);
- quantizing: the integer recipe's per-row activation quantization of each product's input;
- attention: ``models/attention.py``'s nodes (scores, mask, softmax, probabilities x values, KV
  writes, the shared mask tensors) and the rotary embeddings;
- other: norms, activations, splits, the embedding;

plus the wall time of the runs (kernels + dispatch + the copies between runs).

    python benchmarks/prefill_profile.py --recipes fused-q8 fused-int8 --tokens 370
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from nbresponses.models.fidelity_set import FIDELITY_SET
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime import runner as runner_module
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.scheduler import SCORE_CHUNK, prefill_runs

PRODUCT_OPS = {
    "MatMulNBits",
    "MatMulIntegerToFloat",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "GroupProduct",
}
LINEARS = ("/qkv", "/o", "/gate_up", "/down")


def kind(node: str, op: str) -> str:
    """The kind of a node, from its name (the fused builder's) and operator."""
    base = node.split("/")
    if op in PRODUCT_OPS or (op == "MatMul" and ("lm_head" in node or node.endswith(LINEARS))):
        return "products"
    if any(f"{linear}/" in node or f"{linear}_" in node for linear in LINEARS) or (
        node.startswith("lm_head/") or node.startswith("lm_head_")
    ):
        return "quantizing"
    if "/attn/" in node or node.startswith("attn/") or "rotary" in node:
        return "attention"
    if len(base) == 1 and not node.startswith(("layers.", "embed", "final_norm", "logits")):
        return "attention"  # the shared step tensors (positions, mask, scatter index)
    return "other"


def document(tokens: int, tokenizer) -> list[int]:
    text = "\n\n".join(m["content"] for s in FIDELITY_SET for m in s.messages)
    ids = list(tokenizer(text)["input_ids"])
    return ids[:tokens]


def profile(recipe: str, tokens: int, rounds: int, chunk: int) -> dict[str, float]:
    prepared = prepare_model(None, recipe, progress=False)
    ids = document(tokens, prepared.load_tokenizer())
    made = runner_module.session_options

    def profiling(threads: int | None = None):
        options = made(threads)
        options.enable_profiling = True
        options.profile_file_prefix = f"/tmp/prefill_profile_{recipe}"
        return options

    runner_module.session_options = profiling
    try:
        runner = OnnxRunner(prepared.onnx_path)
    finally:
        runner_module.session_options = made

    def prefill() -> float:
        start, past, begin = time.perf_counter(), runner.layout.empty(), 0
        for length in prefill_runs(len(ids), chunk):
            end = begin + length
            window = np.asarray(ids[begin:end], np.int64)[None]
            positions = np.arange(begin, end, dtype=np.int64)[None]
            _, past = runner.run(
                window, np.ones((1, end), np.int64), positions, past, position=None
            )
            begin = end
        return time.perf_counter() - start

    prefill()  # warm-up
    walls = [prefill() for _ in range(rounds)]
    trace = Path(runner.session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    runs = len(prefill_runs(len(ids), chunk))
    per_run = events_by_run(events)[-rounds * runs :]
    totals: dict[str, list[float]] = defaultdict(list)
    for i in range(rounds):
        prefill_kinds: dict[str, float] = defaultdict(float)
        for run in per_run[i * runs : (i + 1) * runs]:
            for name, value in run.items():
                prefill_kinds[name] += value
        for name, value in prefill_kinds.items():
            totals[name].append(value)
    result = {name: statistics.median(v) / 1000 for name, v in totals.items()}
    result["wall"] = statistics.median(walls) * 1000
    return result


def events_by_run(events: list[dict]) -> list[dict[str, float]]:
    """Microseconds of kernel time by kind, for each run of the session (``model_run``)."""
    bounds = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "model_run")
    per_run: list[dict[str, float]] = [defaultdict(float) for _ in bounds]
    starts = [start for start, _ in bounds]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i >= 0 and e["ts"] <= bounds[i][1]:
            per_run[i][kind(node, e["args"]["op_name"])] += e["dur"]
    return [dict(r) for r in per_run]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["fused-q8", "fused-int8", "fused-fp32"])
    parser.add_argument("--tokens", type=int, default=370)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=SCORE_CHUNK)
    args = parser.parse_args()
    runs = len(prefill_runs(args.tokens, args.chunk))
    print(f"prefill of {args.tokens} tokens in {runs} runs of <= {args.chunk}, every logit")
    print("| recipe | wall ms | products | quantizing | attention | other | dispatch+copies |")
    print("|---|---|---|---|---|---|---|")
    for recipe in args.recipes:
        per_prefill = profile(recipe, args.tokens, args.rounds, args.chunk)
        kernels = sum(v for k, v in per_prefill.items() if k != "wall")
        cells = [per_prefill.get(k, 0.0) for k in ("products", "quantizing", "attention", "other")]
        print(
            f"| {recipe} | {per_prefill['wall']:.0f} | "
            + " | ".join(f"{c:.0f}" for c in cells)
            + f" | {per_prefill['wall'] - kernels:.0f} |"
        )


if __name__ == "__main__":
    main()
