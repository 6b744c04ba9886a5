"""``nbresponses demo``: stream one chat answer in the terminal, with its speed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from nbresponses.engine.detokenize import IncrementalDetokenizer
from nbresponses.engine.types import GenerationStats, SamplingParams


async def _demo(args: argparse.Namespace) -> int:
    from nbresponses.engine.engine import OnnxEngine

    engine = await OnnxEngine.load(
        args.model, args.quantization, cache_dir=getattr(args, "cache_dir", None)
    )
    try:
        print(f"model: {engine.prepared.describe()}", file=sys.stderr)
        tokenizer = engine.tokenizer
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True
        )
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
        stats = GenerationStats()
        detok = IncrementalDetokenizer(tokenizer)
        start = time.perf_counter()
        finish = None
        async for step in engine.generate(prompt, params, stats):
            sys.stdout.write(detok.feed(step.token_ids))
            sys.stdout.flush()
            finish = step.finish_reason
        end = time.perf_counter()
        print(detok.flush())
        ttft = (stats.first_token_time or end) - start
        decode_tokens = max(stats.output_tokens - 1, 0)
        rate = decode_tokens / (end - stats.first_token_time) if decode_tokens else 0.0
        print(
            f"[{stats.prompt_tokens} prompt tokens, {stats.output_tokens} generated, "
            f"finish: {finish}; TTFT {ttft * 1000:.0f} ms, decode {rate:.1f} tok/s]",
            file=sys.stderr,
        )
        return 0 if finish != "error" else 1
    finally:
        await engine.aclose()


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of the ``demo`` command (``args``: prompt, model, quantization, max_tokens)."""
    return asyncio.run(_demo(args))
