"""The cost of a logit lens pass against a plain scoring of the same text, in one run.

The bundled model (default recipe unless ``--recipe``), a ~100-token text: ``Engine.logit_lens``
(every layer's head, top-10, next-token rank and KL in one pass) against ``Engine.score(text,
method="prefill")`` (the model's own logprobs in prefill runs), alternating, medians of
``--rounds``. The first lens call (building ``lens.onnx`` once, opening its session) is timed
apart. Then the lens of a factual prompt: each layer's top token at the last position.

    python benchmarks/lens.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import nbresponses as nbr

TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
    "from 1887 to 1889. Locally nicknamed La dame de fer, it was constructed as the centrepiece "
    "of the 1889 World's Fair, and to crown the centennial anniversary of the French Revolution."
)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe", default=None)
    args = parser.parse_args()
    engine = await nbr.Engine.load(None, args.recipe, progress=False, store_path="memory")
    started = time.perf_counter()
    frame = await engine.logit_lens(TEXT)
    first = time.perf_counter() - started
    tokens = int(frame["position"].max()) + 1
    times: dict[str, list[float]] = {"lens": [], "score": []}
    for _ in range(args.rounds):
        engine.generator.prefix_cache.clear()
        t = time.perf_counter()
        await engine.score(TEXT, method="prefill")
        times["score"].append(time.perf_counter() - t)
        t = time.perf_counter()
        await engine.logit_lens(TEXT)
        times["lens"].append(time.perf_counter() - t)
    lens, score = (statistics.median(times[k]) for k in ("lens", "score"))
    print(f"{engine.prepared.recipe}, {tokens} tokens, {frame['layer'].max()} layers:")
    print(f"  first lens call (build + open): {first:.2f} s")
    print(f"  lens pass {lens * 1000:.0f} ms, prefill scoring {score * 1000:.0f} ms: "
          f"{lens / score:.1f}x")  # fmt: skip
    factual = await engine.logit_lens("The capital of France is")
    last = factual[factual["position"] == factual["position"].max()]
    print("  'The capital of France is' -> top token per layer:")
    for _, row in last.iterrows():
        print(f"    layer {row['layer']:>2}: {row['top_token']!r:<12} p={row['top_prob']:.3f}")
    await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
