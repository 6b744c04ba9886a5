"""What a batched step of B rows x S tokens costs, against the cost model speculation plans by.

``runtime/speculation.step_width`` decides how many drafted tokens a step verifies from a cost
model: a step of B rows x S tokens costs ``cost.step + cost.row * B + B * S`` tokens' worth of
compute, ``cost`` the graph's (``speculation.EVERY_COLUMN`` where the attention is standard
operators, ``OWN_COLUMNS`` where it is our KVAttention, as the scheduler picks it). This
script times real steps of the prepared model (in-place KV buffers of ``--keys`` columns a
row, as a decode step sees them) and prints each step's cost relative to a plain step of the
same rows, measured and modelled, so the constants can be checked (or re-fitted) on another
machine or model: the bundled model prepared with ``--recipe``, or any prepared folder
(``--folder``, e.g. one of ``larger.py``'s).

    python benchmarks/speculation.py [--recipe RECIPE] [--keys 250]
    python benchmarks/speculation.py --folder ~/.cache/nbresponses/models/NAME
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from nbresponses.models.prepare import prepare_model
from nbresponses.models.prepared import PreparedModel
from nbresponses.models.recipes import AUTO_ORDER
from nbresponses.runtime.kv import EndPaddedKV, KVBuffer
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.speculation import EVERY_COLUMN, OWN_COLUMNS

ROWS = (1, 4, 16)
WIDTHS = (1, 2, 3, 5, 9)


def _random(buffer: KVBuffer, keys: int, rng: np.random.Generator) -> np.ndarray:
    """One row's random columns; int8 value columns (fused-int8-kernel) random integers, each
    column's trailing 4-byte scale 1/64 (random bytes there could be NaN or subnormal)."""
    shape = (buffer.kv_heads, keys, buffer.width)
    if buffer.dtype != np.int8:
        return rng.standard_normal(shape).astype(buffer.dtype)
    column = rng.integers(-127, 128, shape).astype(np.int8)
    column[..., -4:] = np.frombuffer(np.float32(1 / 64).tobytes(), np.int8)
    return column


def step_ms(runner: OnnxRunner, rows: int, keys: int, reps: int) -> dict[int, float]:
    """Median time of a step feeding each width of ``WIDTHS`` to each of ``rows`` rows of
    ``keys`` keys; the widths take turns, so a noisy moment hits them all alike."""
    layout = runner.layout
    rng = np.random.default_rng(0)
    kv = EndPaddedKV(layout, reads_every_column=True)
    kv.add_rows([[_random(b, keys, rng) for b in layout.buffers] for _ in range(rows)])
    times: dict[int, list[float]] = {width: [] for width in WIDTHS}
    for _ in range(reps):
        for width in WIDTHS:
            start = time.perf_counter()
            kv.step_tokens(runner, [[5] * width] * rows)
            times[width].append(time.perf_counter() - start)
            for i in range(rows):
                kv.truncate(i, keys)
    return {width: statistics.median(t) * 1000 for width, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=AUTO_ORDER[0])
    parser.add_argument("--keys", type=int, default=250)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--folder", type=Path, help="a prepared model's folder (not the bundled)")
    args = parser.parse_args()
    if args.folder is not None:
        prepared = PreparedModel.open(args.folder)
    else:
        prepared = prepare_model(None, args.recipe, progress=False)
    runner, name = OnnxRunner(prepared.onnx_path), f"{prepared.name} [{prepared.recipe}]"
    if not runner.exact_steps:
        raise SystemExit(f"{name}: its graph cannot verify drafts (no exact steps)")
    step_ms(runner, 1, args.keys, 1)  # warm-up
    print(f"{name}, {args.keys} keys a row, medians of {args.reps}")
    cost = EVERY_COLUMN if runner.reads_every_column else OWN_COLUMNS  # the scheduler's choice
    print(f"model: {cost.step} + {cost.row} x rows + rows x width\n")
    print("| rows | width | ms | vs width 1, measured | vs width 1, model |")
    print("|---|---|---|---|---|")
    for rows in ROWS:
        measured = step_ms(runner, rows, args.keys, args.reps)
        overhead = cost.step + cost.row * rows
        for width, ms in measured.items():
            model = (overhead + rows * width) / (overhead + rows)
            ratio = ms / measured[1]
            print(f"| {rows} | {width} | {ms:.1f} | {ratio:.2f}x | {model:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
