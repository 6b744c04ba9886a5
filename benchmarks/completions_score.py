"""Scoring through HTTP against scoring in the kernel, on the same engine, in one run.

The corpus of ``score.py`` (8 documents, ~2,900 tokens) is scored as plain text, every
token's logprob given the ones before it, by the same loaded engine three ways, round-robin,
medians of ``--rounds``:

- in the kernel: ``engine.score_many(method="prefill")``;
- ``nbr.RemoteEngine`` against ``nbresponses serve`` (uvicorn on a thread of this process,
  loopback): ``/tokenize`` per text, then one ``/v1/completions`` per document with
  ``echo=True, max_tokens=0, prompt_logprobs``;
- one lm-evaluation-harness-shaped request: all documents' token ids in one ``prompt``,
  ``echo=True, max_tokens=1, logprobs=1`` (``local-completions``' body).

It also checks that the three give the same logprobs, float for float.

    python benchmarks/completions_score.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).parent))
from score import corpus

import nbresponses as nbr
from nbresponses.server.serve import make_server


class Server:
    """``nbresponses serve`` for an engine already loaded, on a thread, on a free port."""

    def __init__(self, engine: nbr.Engine) -> None:
        self.server = make_server(engine.client(), port=0, log_level="warning")
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = await nbr.Engine.load(progress=False)
    texts = corpus()
    start_id = engine.generator.eos_token_ids[0]
    family = engine.client().family
    documents = [[start_id, *family.encode(t)] for t in texts]
    tokens = sum(len(d) - 1 for d in documents)
    print(f"{engine!r}\n{len(texts)} documents, {tokens} scored tokens")

    with Server(engine) as server:
        remote = nbr.RemoteEngine(server.base_url, document_start=start_id)
        http = httpx2.AsyncClient(base_url=server.base_url, timeout=600)
        got: dict[str, list[list[float]]] = {}

        def values(scorings: list[Any]) -> list[list[float]]:
            return [[lp.logprob for lp in s.output[0].content[0].logprobs] for s in scorings]

        async def kernel() -> None:
            many = engine.score_many(texts, method="prefill", progress=False)
            got["kernel"] = values([s async for s in many])

        async def remote_engine() -> None:
            got["RemoteEngine"] = values(
                [s async for s in remote.score_many(texts, progress=False)]
            )

        async def lm_eval_body() -> None:
            body = {"model": engine.model, "prompt": documents, "max_tokens": 1, "echo": True,
                    "logprobs": 1, "temperature": 0, "seed": 1234}  # fmt: skip
            response = (await http.post("/completions", json=body)).json()
            choices = sorted(response["choices"], key=lambda c: c["index"])
            got["lm-eval body"] = [c["logprobs"]["token_logprobs"][1:-1] for c in choices]

        systems: dict[str, Callable[[], Awaitable[None]]] = {
            "in the kernel (score_many, prefill)": kernel,
            "RemoteEngine over HTTP": remote_engine,
            "one lm-eval-shaped request over HTTP": lm_eval_body,
        }
        times: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds + 1):  # the first round warms up, and is not counted
            for name, run in systems.items():
                t0 = time.perf_counter()
                await run()
                times[name].append(time.perf_counter() - t0)
        await remote.aclose()
        await http.aclose()
    base = statistics.median(times["in the kernel (score_many, prefill)"][1:])
    print("\n| path | tokens/s | vs in the kernel |\n|---|---|---|")
    for name, spent in times.items():
        median = statistics.median(spent[1:])
        print(f"| {name} | {tokens / median:.0f} | {base / median:.2f}x |")
    same = all(v == got["kernel"] for v in got.values())
    print(f"\nthe same logprobs, float for float, on all three paths: {same}")
    await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
