"""Overhead of the Responses protocol layer over raw engine decoding, on the bundled model.

Both paths decode the same prompt greedily on the same engine: the raw path consumes
``engine.generate`` steps; the protocol path streams ``client.responses.create(stream=True)``
events (rendering, incremental detokenization, parsing, event building, store). Rounds alternate
between the two and the script prints medians of seconds per output token and their ratio
(target: the protocol adds <= 5%). Run with and without logprobs (top 5).

    python benchmarks/protocol.py [--rounds 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from nbresponses.engine import Engine
from nbresponses.tokens.contract import SamplingParams

PROMPT = "Give me three tips for staying focused while studying."


async def raw(engine: Engine, tokens: int, top: int) -> float:
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    params = SamplingParams(
        max_tokens=tokens,
        temperature=0,
        logprobs=top > 0,
        top_logprobs=top,
        stop_token_ids=tuple(engine.generator.eos_token_ids),
    )
    start = time.perf_counter()
    tokens_out = 0
    async for step in engine.generator.generate(prompt, params):
        tokens_out += len(step.token_ids)
    return (time.perf_counter() - start) / tokens_out


async def protocol(engine: Engine, tokens: int, top: int) -> float:
    options = {"top_logprobs": top, "include": ["message.output_text.logprobs"]} if top else {}
    start = time.perf_counter()
    stream = await engine.client().responses.create(
        input=PROMPT, max_output_tokens=tokens, temperature=0, stream=True, store=False, **options
    )
    final = None
    async for event in stream:
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None
    return (time.perf_counter() - start) / final.usage.output_tokens


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--quantization", default=None)
    args = parser.parse_args()
    engine = await Engine.load(
        quantization=args.quantization, progress=False, prefix_cache_bytes=0
    )  # no reuse: both paths prefill alike
    print(f"{engine.prepared.describe()}; {args.tokens} tokens, {args.rounds} rounds")
    try:
        for top in (0, 5):
            times: dict[str, list[float]] = {"raw": [], "protocol": []}
            await raw(engine, 8, top)  # warm both paths
            await protocol(engine, 8, top)
            for _ in range(args.rounds):
                times["raw"].append(await raw(engine, args.tokens, top))
                times["protocol"].append(await protocol(engine, args.tokens, top))
            r, p = (statistics.median(times[k]) for k in ("raw", "protocol"))
            print(
                f"top_logprobs={top}: raw {r * 1e3:.2f} ms/token ({1 / r:.1f} tok/s), "
                f"protocol {p * 1e3:.2f} ms/token ({1 / p:.1f} tok/s): "
                f"overhead {(p / r - 1) * 100:+.1f}% (target <= 5%)"
            )
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
