"""Multiple choice on the engine: options scored as the rows of shared runs, against each option
in runs of its own, in one run.

``engine.choose_many`` over ``--questions`` questions of ~40 words (the fidelity set's turns),
four options of one word each, the prefix cache on (the default: each question is computed
once, its options after it), the options of ``concurrency`` questions at a time (its default,
4). The engine as it is (short scoring jobs queued together share a graph run: ``together``)
against the same engine with ``scoring_together`` off, round-robin, medians; the frames must be
equal, float for float.

    python benchmarks/choice.py [--recipe fused-int8-kernel] [--questions 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import pandas as pd
from score import corpus

import nbresponses as nbr
from nbresponses.models.cpu import physical_cores
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime.generator import TokenGenerator


def questions(count: int) -> pd.DataFrame:
    words = " ".join(corpus(4)).split()
    return pd.DataFrame(
        {
            "question": [" ".join(words[i * 40 : (i + 1) * 40]) + " Answer:" for i in range(count)],
            "options": [[" " + w for w in words[-4 * (i + 1) :][:4]] for i in range(count)],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="fused-int8-kernel")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    prepared = prepare_model(None, args.recipe, progress=False)
    engine = nbr.Engine(TokenGenerator(prepared))
    frame = questions(args.questions)
    print(
        f"{prepared.describe()}\n{args.questions} questions x 4 options, {physical_cores()} threads"
    )

    async def run(together: bool) -> tuple[float, pd.DataFrame]:
        engine.generator.scoring_together = together
        engine.generator.prefix_cache.clear()  # every round computes its questions
        start = time.perf_counter()
        out = await engine.choose_many(frame, progress=False)
        return time.perf_counter() - start, out

    asyncio.run(run(True))  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    frames: dict[bool, pd.DataFrame] = {}
    for number in range(args.rounds):
        for together in (True, False) if number % 2 == 0 else (False, True):
            seconds, frames[together] = asyncio.run(run(together))
            times[together].append(seconds)
    shared, alone = (statistics.median(times[t]) for t in (True, False))
    options = 4 * args.questions
    print("\n| options | ms per question | options/s | vs each alone |\n|---|---|---|---|")
    for name, seconds in (("in shared runs", shared), ("each in runs of its own", alone)):
        print(
            f"| {name} | {seconds / args.questions * 1000:.1f} | {options / seconds:.0f} | "
            f"{alone / seconds:.2f}x |"
        )
    pd.testing.assert_frame_equal(frames[True], frames[False])
    print("the same frame, float for float: True")
    engine.generator.close_sync()


if __name__ == "__main__":
    main()
