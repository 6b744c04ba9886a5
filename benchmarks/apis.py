"""The cost of each API on one request: Responses, Chat Completions and Completions, in process
and over HTTP, on the bundled model.

One prompt, greedy, the same number of tokens through every path: Responses (``input``), Chat
Completions (the same conversation as ``messages``) and Completions (``prompt`` = the token ids
the chat template renders for that conversation, so the model sees the same ids). Each path is
the real openai SDK: in process through ``engine.openai()``, and over HTTP to the server
``nbresponses serve`` runs (``make_server`` on uvicorn, loopback, in a thread of this process, on
the same engine). A first untimed round asks every path for logprobs and checks that the six
give the same tokens and the same logprob floats; the timed rounds (no logprobs) go round-robin
over the paths and check the same text and token count each time. Prints the median tok/s of
each path (tokens over the wall time of the whole request, prefill included; the prompt's
prefix is cached after the first round for every path alike) and its ratio to Responses in
process.

    python benchmarks/apis.py [--rounds 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.server import ThreadedServer

import nbresponses as nbr
from nbresponses.protocol.request import LOGPROBS_INCLUDE, parse_create

PROMPT = "Give me three tips for staying focused while studying."
APIS = ("responses", "chat", "completions")

# (text, output tokens, [(token, logprob)] or None)
Answer = tuple[str, int, list[tuple[str, float]] | None]


def paths(engine: nbr.Engine, ids: list[int], tokens: int, sdks: dict[str, Any]) -> dict:
    """``(api, transport) -> request(logprobs) -> Answer`` for every API on every SDK."""
    messages = [{"role": "user", "content": PROMPT}]

    def make(api: str, sdk: Any) -> Callable[[bool], Awaitable[Answer]]:
        async def responses(logprobs: bool) -> Answer:
            extra = {"include": [LOGPROBS_INCLUDE]} if logprobs else {}
            r = await sdk.responses.create(
                model=engine.model, input=PROMPT, temperature=0, max_output_tokens=tokens,
                store=False, **extra,
            )  # fmt: skip
            lps = [(t.token, t.logprob) for t in r.output[-1].content[0].logprobs or []]
            return r.output_text, r.usage.output_tokens, lps if logprobs else None

        async def chat(logprobs: bool) -> Answer:
            c = await sdk.chat.completions.create(
                model=engine.model, messages=messages, temperature=0,
                max_completion_tokens=tokens, logprobs=logprobs,
            )  # fmt: skip
            choice = c.choices[0]
            lps = [(t.token, t.logprob) for t in choice.logprobs.content] if logprobs else None
            return choice.message.content, c.usage.completion_tokens, lps

        async def completions(logprobs: bool) -> Answer:
            c = await sdk.completions.create(
                model=engine.model, prompt=ids, temperature=0, max_tokens=tokens,
                **({"logprobs": 0} if logprobs else {}),
            )  # fmt: skip
            choice = c.choices[0]
            lps = None
            if logprobs:
                lps = list(zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, strict=True))
            return choice.text, c.usage.completion_tokens, lps

        return {"responses": responses, "chat": chat, "completions": completions}[api]

    return {(api, where): make(api, sdk) for where, sdk in sdks.items() for api in APIS}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="a hub id; default: the bundled model")
    args = parser.parse_args()

    engine = await nbr.Engine.load(args.model)
    client = engine.client()
    req = parse_create({"input": PROMPT}, model=engine.model)
    ids = list(client.family.render(req, req.input).ids)  # the chat-rendered prompt
    with ThreadedServer(client) as server:
        sdks = {"in process": engine.openai(), "HTTP": server.openai(timeout=600)}
        requests = paths(engine, ids, args.tokens, sdks)

        first = {key: await request(True) for key, request in requests.items()}
        want = first["responses", "in process"]
        for key, answer in first.items():
            assert answer == want, f"{key} differs from Responses in process"
        assert want[1] == args.tokens, f"the answer ended after {want[1]} tokens; ask for fewer"
        print(f"same tokens and logprobs through all {len(first)} paths ({want[1]} tokens)")

        seconds: dict[tuple[str, str], list[float]] = {key: [] for key in requests}
        for _ in range(args.rounds):
            for key, request in requests.items():
                start = time.perf_counter()
                text, count, _ = await request(False)
                seconds[key].append(time.perf_counter() - start)
                assert (text, count) == want[:2], f"{key} gave another answer"
    await engine.aclose()

    base = args.tokens / statistics.median(seconds["responses", "in process"])
    print(f"\n### one request, {args.tokens} greedy tokens, median of {args.rounds} rounds\n")
    print("| API | transport | ms per request | tok/s | vs Responses in process |")
    print("|---|---|---|---|---|")
    for (api, where), times in seconds.items():
        median = statistics.median(times)
        rate = args.tokens / median
        print(f"| {api} | {where} | {median * 1000:.0f} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())
