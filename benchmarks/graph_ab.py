"""Prepared graphs side by side: a decode step at batch 1 and 16 and a 370-token scoring prefill
of each, in rounds that take the graphs in turn (so the machine's drift reaches all alike),
medians in ms. Use it to compare a graph before and after a change: prepared folders from the
cache (``nbresponses models`` lists them) or ``.onnx`` files beside their weights.

- step: ``--keys`` columns of KV per row (zeros), one new token per row, the KV cut back after
  each step (what ``step_profile.py`` profiles);
- prefill: a scoring job's runs (``SCORE_CHUNK`` tokens, every position's logits).

    python benchmarks/graph_ab.py FOLDER_OR_ONNX [...] [--rounds 15] [--batches 1 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from nbresponses.runtime.kv import EndPaddedKV
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.scheduler import SCORE_CHUNK, prefill_runs


def _runner(path: str) -> OnnxRunner:
    model = Path(path)
    return OnnxRunner(model if model.suffix == ".onnx" else model / "model.onnx")


def step_timer(runner: OnnxRunner, batch: int, keys: int):
    kv = EndPaddedKV(runner.layout, reads_every_column=runner.reads_every_column)
    shape = (runner.layout.kv_heads, keys, runner.layout.head_dim)
    kv.add_rows([[np.zeros(shape, runner.layout.dtype) for _ in runner.layout.past_names]] * batch)

    def step() -> float:
        start = time.perf_counter()
        kv.step(runner, [5] * batch)
        elapsed = time.perf_counter() - start
        for row in range(batch):
            kv.truncate(row, keys)
        return elapsed

    return step


def prefill_timer(runner: OnnxRunner, tokens: int):
    # prefill_runs gives an odd count one dummy token more (as the scheduler feeds it)
    ids = np.random.default_rng(0).integers(100, 40_000, tokens + tokens % 2)

    def prefill() -> float:
        start, past, begin = time.perf_counter(), runner.layout.empty(), 0
        for length in prefill_runs(tokens, SCORE_CHUNK):
            end = begin + length
            _, past = runner.run(
                ids[None, begin:end],
                np.ones((1, end), np.int64),
                np.arange(begin, end, dtype=np.int64)[None],
                past,
                position=None,
            )
            begin = end
        return time.perf_counter() - start

    return prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="+")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=370, help="the prefill's length")
    args = parser.parse_args()
    runners = [_runner(g) for g in args.graphs]
    columns: dict[str, list] = {}
    for batch in args.batches:
        columns[f"step x{batch}"] = [(step_timer(r, batch, args.keys), 10) for r in runners]
    columns[f"prefill {args.tokens}"] = [(prefill_timer(r, args.tokens), 1) for r in runners]
    times: dict[str, list[list[float]]] = {c: [[] for _ in runners] for c in columns}
    for timers in columns.values():
        for timer, repeats in timers:  # warm-up
            for _ in range(repeats):
                timer()
    for _ in range(args.rounds):
        for column, timers in columns.items():
            for i, (timer, repeats) in enumerate(timers):
                times[column][i] += [timer() for _ in range(repeats)]
    print("| graph | " + " | ".join(f"{c} ms" for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for i, graph in enumerate(args.graphs):
        cells = [f"{statistics.median(times[c][i]) * 1000:.2f}" for c in columns]
        print(f"| {Path(graph).name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
