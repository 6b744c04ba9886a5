"""How fast this machine streams memory, the batch-1 decode roofline: a decode step reads every
weight once, so tokens/s can be at most GB/s divided by the bytes read a token.

numpy sums a buffer far larger than the last-level cache on 1 and on ``--threads`` threads
(numpy releases the GIL in the reduction; float64, so the adds are never the limit), and the
bytes a token of the bundled model reads on each fused recipe follow from its prepared weights
(the file's size, less the embedding table, of which a step reads one row).

    python benchmarks/bandwidth.py [--mib 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from nbresponses.models.prepare import prepare_model


def streamed_gb_per_s(buffer: np.ndarray, threads: int) -> float:
    parts = np.array_split(buffer, threads)
    sums = [0.0] * threads

    def read(i: int) -> None:
        sums[i] = float(parts[i].sum())

    workers = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return buffer.nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipes", nargs="+", default=["fused-q8", "fused-int8"])
    args = parser.parse_args()
    buffer = np.ones(args.mib * 2**20 // 8, np.float64)
    rates = {}
    for threads in sorted({1, args.threads}):
        rates[threads] = statistics.median(streamed_gb_per_s(buffer, threads) for _ in range(7))
        print(f"{threads} thread(s): {rates[threads]:.1f} GB/s")
    best = max(rates.values())
    for recipe in args.recipes:
        prepared = prepare_model(None, recipe, progress=False)
        data = prepared.onnx_path.with_name(prepared.onnx_path.name + ".data")
        config = prepared.config
        embedding = config["vocab_size"] * config["hidden_size"] * 4  # fp32 table, Gather'd
        read = (data.stat().st_size - embedding) / 1e6
        print(
            f"{recipe}: ~{read:.0f} MB of weights read a token -> at most "
            f"{best * 1e3 / read:.0f} tok/s at {best:.1f} GB/s"
        )


if __name__ == "__main__":
    main()
