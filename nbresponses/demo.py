"""``nbresponses demo``: stream one answer through the Responses API in the terminal.

It walks the same path as a notebook — ``nbr.Engine`` → ``client.responses.create(stream=True)``
→ ``openai.types.responses`` events — and prints what a user would want to know about the run:
usage, time to first token, decode speed, and how sure the model was of its first token.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time

from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)

from nbresponses.engine import Engine
from nbresponses.service.stream import ResponseEventStream

FINAL_EVENTS = (ResponseCompletedEvent, ResponseIncompleteEvent, ResponseFailedEvent)
DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."


async def stream_answer(args: argparse.Namespace) -> int:
    engine = await Engine.load(args.model, args.quantization, cache_dir=args.cache_dir)
    try:
        print(f"model: {engine.prepared.describe()}", file=sys.stderr)
        start = time.perf_counter()
        first_delta: float | None = None
        first_token = None
        final = None
        stream = await engine.client().responses.create(
            input=args.prompt,
            max_output_tokens=args.max_tokens,
            temperature=args.temperature,
            top_logprobs=5,
            include=["message.output_text.logprobs"],
            stream=True,
        )
        assert isinstance(stream, ResponseEventStream)
        async for event in stream:
            if isinstance(event, ResponseTextDeltaEvent):
                if first_delta is None:
                    first_delta = time.perf_counter()
                    first_token = event.logprobs[0] if event.logprobs else None
                sys.stdout.write(event.delta)
                sys.stdout.flush()
            elif isinstance(event, FINAL_EVENTS):
                final = event.response
        end = time.perf_counter()
        print()
        if final is None:
            print("the stream ended without a final response", file=sys.stderr)
            return 1
        print(summary(final, start, first_delta, end, first_token), file=sys.stderr)
        return 0 if final.status != "failed" else 1
    finally:
        await engine.aclose()


def summary(final, start: float, first: float | None, end: float, first_token) -> str:
    """Usage, TTFT, decode rate and the first token's margin over its runner-up."""
    usage = final.usage
    status = final.status
    if final.incomplete_details is not None:
        status += f" ({final.incomplete_details.reason})"
    lines = [
        f"[{status}: {usage.input_tokens} input tokens "
        f"({usage.input_tokens_details.cached_tokens} cached), {usage.output_tokens} output]"
    ]
    if first is not None:
        decode = (usage.output_tokens - 1) / (end - first) if end > first else 0.0
        lines.append(
            f"[time to first token {(first - start) * 1000:.0f} ms, "
            f"decode {decode:.1f} tok/s, wall {end - start:.2f} s]"
        )
    if first_token is not None and len(first_token.top_logprobs) > 1:
        alternatives = ", ".join(
            f"{alt.token!r} {math.exp(alt.logprob):.0%}" for alt in first_token.top_logprobs[:3]
        )
        lines.append(f"[first token {first_token.token!r}: {alternatives}]")
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    return asyncio.run(stream_answer(args))
