"""The cost of ``Engine.sample(n=16)`` against 16 separate requests, in one run.

One prompt (a short chat question, and a ~300-token document question), ``n`` seeded
completions of ``--tokens`` tokens at temperature 1, three ways, round-robin, medians of
``--rounds``:

- ``sample``: ``engine.sample(prompt, n=n, seed=...)``: one batch, one prefill shared;
- ``concurrent``: ``n`` separate ``responses.create`` calls gathered at once (continuous
  batching; each prefilled on its own, the prefix cache serving all but the first);
- ``sequential``: the same ``n`` requests one after another;
- ``sample`` and ``concurrent`` again with the prefix cache off (``dynamic-int8``'s case, or
  ``prefix_cache_bytes=0``): then only ``sample`` shares the prompt's prefill.

Every request asks for the same logprobs (raw and processed, as ``sample`` does), each has a
fresh seed per round (no output is reused) and the prefix cache is emptied between runs, so
every run pays its prompt. Prints output tokens per second over the wall time and the ratios
to ``sample``.

    python benchmarks/sample.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import nbresponses as nbr
from nbresponses.models.fidelity_set import FIDELITY_SET
from nbresponses.runtime.sampling import derived_seeds

QUESTION = "Name a country in Europe and say one thing about it."


def document_question() -> str:
    texts = [m["content"] for s in FIDELITY_SET for m in s.messages if m["role"] == "assistant"]
    return "Read these notes, then name the one you find most useful.\n\n" + "\n\n".join(texts[:5])


async def run(engine: nbr.Engine, how: str, prompt: str, n: int, seed: int, tokens: int) -> float:
    """Output tokens per second of one way of getting ``n`` completions."""
    cache = engine.generator.prefix_cache
    cache.clear()
    budget = cache.budget_bytes
    if how.endswith("no prefix cache"):
        cache.budget_bytes = 0
    options = {"temperature": 1.0, "max_output_tokens": tokens, "store": False}
    client = engine.client()
    started = time.perf_counter()
    if how.startswith("sample"):
        responses = await engine.sample(prompt, n=n, seed=seed, **options)
    else:
        creates = [
            client.responses.create(
                input=prompt,
                include=["message.output_text.logprobs"],
                extra_body={"seed": one, "logprobs_mode": "processed_logprobs"},
                **options,
            )
            for one in derived_seeds(seed, n)
        ]
        if how.startswith("concurrent"):
            responses = await asyncio.gather(*creates)
        else:
            responses = [await c for c in creates]
    elapsed = time.perf_counter() - started
    cache.budget_bytes = budget
    return sum(r.usage.output_tokens for r in responses) / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    engine = await nbr.Engine.load(progress=False, store_path="memory")
    prompts = {"chat question": QUESTION, "document question": document_question()}
    ways = (
        "sample",
        "concurrent",
        "sequential",
        "sample, no prefix cache",
        "concurrent, no prefix cache",
    )
    for name, prompt in prompts.items():
        length = len(engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]))
        rates: dict[str, list[float]] = {how: [] for how in ways}
        await run(engine, "sample", prompt, 2, 0, 4)  # warm-up
        for r in range(args.rounds):
            for how in ways:
                rates[how].append(await run(engine, how, prompt, args.n, 1000 * r + 1, args.tokens))
        best = statistics.median(rates["sample"])
        print(f"{name} ({length} prompt tokens), n={args.n}, {args.tokens} tokens each:")
        for how in ways:
            median = statistics.median(rates[how])
            print(f"  {how:<28} {median:7.1f} tok/s  (sample is {best / median:.2f}x)")
    await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
