"""Prepared graphs side by side: a decode step at batch 1 and 16 and a 370-token scoring prefill
of each, in rounds that take the graphs in turn (so the machine's drift reaches all alike),
medians in ms. Use it to compare a graph before and after a change: prepared folders from the
cache (``nbresponses models`` lists them) or ``.onnx`` files beside their weights.

- step: ``--keys`` columns of KV per row (zeros), one new token per row, the KV cut back after
  each step (what ``step_profile.py`` profiles);
- prefill: a scoring job's runs (``SCORE_CHUNK`` tokens, every position's logits).

Each graph runs in a process of its own, one process a graph a round: two sessions in one
process keep each other's thread pools busy, and read one-row steps of the same graph up to
0.5 ms apart (benchmarks/README.md, "Every RMSNorm as our SkipNorm").

    python benchmarks/graph_ab.py FOLDER_OR_ONNX [...] [--rounds 15] [--batches 1 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
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
    kv.add_rows([runner.layout.zeros(keys)] * batch)

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


def measure(graph: str, batches: list[int], keys: int, tokens: int, rounds: int) -> dict:
    """{column: times in seconds} of one graph in this process, after a warm-up."""
    runner = _runner(graph)
    timers = {f"step x{b}": (step_timer(runner, b, keys), 10) for b in batches}
    timers[f"prefill {tokens}"] = (prefill_timer(runner, tokens), 1)
    for timer, repeats in timers.values():
        for _ in range(repeats):
            timer()
    times: dict[str, list[float]] = {column: [] for column in timers}
    for _ in range(rounds):
        for column, (timer, repeats) in timers.items():
            times[column] += [timer() for _ in range(repeats)]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="+")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=370, help="the prefill's length")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one graph, one round: its times as JSON
        times = measure(args.graphs[0], args.batches, args.keys, args.tokens, args.rounds)
        print(json.dumps(times))
        return
    collected: list[dict[str, list[float]]] = [{} for _ in args.graphs]
    for _ in range(args.rounds):  # the graphs in turn, each in a fresh process
        for i, graph in enumerate(args.graphs):
            command = [sys.executable, __file__, graph, "--child", "--rounds", "1"]
            command += ["--keys", str(args.keys), "--tokens", str(args.tokens), "--batches"]
            command += [str(b) for b in args.batches]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            for column, values in json.loads(done.stdout.splitlines()[-1]).items():
                collected[i].setdefault(column, []).extend(values)
    columns = list(collected[0])
    print("| graph | " + " | ".join(f"{c} ms" for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for graph, times in zip(args.graphs, collected, strict=True):
        cells = [f"{statistics.median(times[c]) * 1000:.2f}" for c in columns]
        print(f"| {Path(graph).name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
