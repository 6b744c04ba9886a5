"""Server overhead: µs per event in process vs over HTTP, and 50 concurrent streaming clients.

A scripted token source replays ~1000 tokens with no delay, so the time is all protocol and
transport. Per-event overhead = (time to read the stream through the openai SDK - time to read
the same stream straight from ``AsyncResponsesClient``) / events; medians of rounds, all in
one process, side by side (timings on this machine are noisy: compare ratios, not absolutes).

    python benchmarks/server.py [--rounds 5] [--tokens 1000] [--clients 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import httpx2
from helpers.responses import MODEL
from helpers.server import ThreadedServer, scripted

from nbresponses.server.inprocess import InProcessServer


def load_tokenizer():
    from transformers import AutoTokenizer

    from nbresponses.models.prepare import tokenizer_folder

    return AutoTokenizer.from_pretrained(str(tokenizer_folder()))


async def read_direct(client) -> int:
    stream = await client.responses.create(input="x", stream=True)
    return sum([1 async for _ in stream])


async def read_sdk(sdk) -> int:
    stream = await sdk.responses.create(model=MODEL, input="x", stream=True)
    return sum([1 async for _ in stream])


async def timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    events = await fn(*args)
    return time.perf_counter() - start, events


async def per_event(tokenizer, tokens: int, rounds: int) -> None:
    text = " ".join(["tok"] * tokens)
    client, _ = scripted(tokenizer, text)
    in_process = InProcessServer(client).openai()
    with ThreadedServer(client) as server:
        http = server.openai(http_client=httpx2.AsyncClient(timeout=60))
        # warm-up
        for fn, arg in ((read_direct, client), (read_sdk, in_process), (read_sdk, http)):
            await fn(arg)
        times: dict[str, list[float]] = {"direct": [], "in-process": [], "http": []}
        events = 0
        for _ in range(rounds):
            for name, fn, arg in (
                ("direct", read_direct, client),
                ("in-process", read_sdk, in_process),
                ("http", read_sdk, http),
            ):
                elapsed, events = await timed(fn, arg)
                times[name].append(elapsed)
    base = statistics.median(times["direct"])
    print(f"stream of {events} events, median of {rounds} rounds")
    for name, values in times.items():
        med = statistics.median(values)
        extra = (med - base) / events * 1e6
        line = f"  {name:11} {med * 1e3:8.1f} ms  {med / events * 1e6:7.1f} µs/event"
        if name != "direct":
            line += f"  overhead over direct {extra:6.1f} µs/event"
        print(line)


async def many_clients(tokenizer, clients: int) -> None:
    text = "The quick brown fox jumps over the lazy dog, again and again."
    client, _ = scripted(tokenizer, text)
    with ThreadedServer(client) as server:
        limits = httpx2.Limits(max_connections=clients + 8)
        sdk = server.openai(http_client=httpx2.AsyncClient(limits=limits, timeout=60))
        await read_sdk(sdk)
        start = time.perf_counter()
        counts = await asyncio.gather(*(read_sdk(sdk) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    total = sum(counts)
    print(
        f"{clients} concurrent streaming clients over HTTP: {elapsed * 1e3:.0f} ms total, "
        f"{total} events, {total / elapsed:,.0f} events/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    asyncio.run(per_event(tokenizer, args.tokens, args.rounds))
    asyncio.run(many_clients(tokenizer, args.clients))


if __name__ == "__main__":
    main()
