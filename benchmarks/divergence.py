"""The cost of a full-vocabulary comparison of two recipes over a corpus, and its report.

Both engines score the same tokens (``Engine.divergence``: prefill chunks of ``--chunk`` tokens,
one engine and then the other, every position's two full distributions reduced to KL, Δp,
ranks and top-1 agreement before the next chunk). Timed against each engine scoring the
corpus alone (``score_many``, ``method="prefill"``) in the same run, round-robin, medians of
``--rounds``; then llama.cpp's KL-divergence statistics (``nbr.divergence_summary``).

    python benchmarks/divergence.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from score import corpus

import nbresponses as nbr
from nbresponses.models.prepare import prepare_model
from nbresponses.models.recipes import AUTO_ORDER
from nbresponses.runtime.generator import TokenGenerator


async def alone(engine: nbr.Engine, texts: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = 0
    async for s in engine.score_many(texts, method="prefill", progress=False):
        tokens += len(s.output[0].content[0].logprobs)
    return time.perf_counter() - start, tokens


async def side_by_side(
    base: nbr.Engine, other: nbr.Engine, texts: list[str], chunk: int
) -> tuple[float, int, object]:
    start = time.perf_counter()
    frame = await base.divergence(other, texts, names=("fp32", "q8"), chunk=chunk, progress=False)
    return time.perf_counter() - start, len(frame), frame


async def main_async(args: argparse.Namespace) -> None:
    texts = corpus(args.documents // 2)
    engines = {}
    for recipe in ("analysis", args.recipe):
        prepared = prepare_model(None, recipe, progress=False)
        # no prefix cache across rounds: every round computes everything (a chunk's context is
        # still reused within a round through the cache of that round's own requests)
        engines[prepared.recipe] = nbr.Engine(TokenGenerator(prepared), store_path="off")
    base, other = engines.values()
    names = list(engines)
    timings: dict[str, list[float]] = {f"{names[0]} alone": [], f"{names[1]} alone": []}
    timings["compare (full vocabulary)"] = []
    frame = None
    for round_ in range(args.rounds + 1):  # the first is a warm-up
        for engine in (base, other):
            engine.generator.prefix_cache.clear()
        t0, n0 = await alone(base, texts)
        t1, n1 = await alone(other, texts)
        for engine in (base, other):
            engine.generator.prefix_cache.clear()
        t2, n2, frame = await side_by_side(base, other, texts, args.chunk)
        if round_:
            timings[f"{names[0]} alone"].append(n0 / t0)
            timings[f"{names[1]} alone"].append(n1 / t1)
            timings["compare (full vocabulary)"].append(n2 / t2)
    print(f"corpus: {len(texts)} documents, {n2} tokens; chunk {args.chunk}")
    print("\n| run | tokens/s (median) |\n|---|---|")
    for name, values in timings.items():
        print(f"| {name} | {statistics.median(values):.0f} |")
    summary = nbr.divergence_summary(frame, names=("fp32", "q8"))
    print(f"\n{names[0]} (base) vs {names[1]}:")
    for key in ("ppl_fp32", "ppl_q8", "ppl_ratio", "ppl_ratio_unc", "kld_mean", "kld_mean_unc",
                "kld_median", "kld_p90", "kld_p99", "kld_max", "dp_rms", "same_top1"):  # fmt: skip
        print(f"  {key:16s} {summary[key]:.6f}")
    for engine in engines.values():
        await engine.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--recipe", default=AUTO_ORDER[0], help="compared with the fp32 analysis")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
